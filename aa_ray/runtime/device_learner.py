"""DeviceLearner: the env, the replay ring and the learner in one process on one device
(`runtime.mode: device`), so a transition never leaves the device between the simulator and the
update.

One iteration (`iterate`):

    acting module <- the learner's policy weights     (once per iteration, when they changed)
    num_steps x: act on the device -> env.step -> replay ring slice, episode counters, moments
    moments -> normalizers (all-reduced over the learners first: every rank merges the same numbers)
    updates_per_iteration batches drawn from the ring on the device -> the learner's updates
    one host read: the learner's diagnostics, this iteration's env steps, replay size and episodes

With several learners (one process per GPU, each with its own env copies and ring) the learners'
DDP keeps the networks in step, as in FastTD3's multi-GPU recipe: each rank trains on its own ring's
shard of the global batch. The class is composition, not a new learner: it owns a `Learner`
(`rendezvous_address`, `join`, checkpoints and weights delegate to it), a `BatchedEnv` and a
`DeviceReplay`.

Episodes: each iteration reports every finished episode (`ChunkStats.episodes`, the driver's
episode count); the newest `tensor_steps.EPISODES_READ` of them with their own return, length and info, any
older ones of the same iteration with their means (thousands of copies can end episodes in one
step, and the driver's train/* metrics average only the newest few), so the read stays small.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aa_ray import seeding
from aa_ray.algos.config import OffPolicyKnobs
from aa_ray.algos.registry import build_policy
from aa_ray.envs.batched import BatchedEnv
from aa_ray.envs.make import make_batched_env
from aa_ray.errors import SpecError
from aa_ray.nets.policy import to_bounds
from aa_ray.records import ChunkStats, DeviceSample, LearnerReport, LearnerState, NormMoments, ObsDims
from aa_ray.runtime.device_replay import DeviceReplay
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.tensor_steps import (
    NO_OBS_MOMENTS,
    NO_RETURN_MOMENTS,
    EpisodeCounters,
    MomentSums,
    cpu_copies,
    evaluate_first_episodes,
)
from aa_ray.spec.experiment import ExperimentSpec


class DeviceLearner:
    """A learner process of `runtime.mode: device` (see the module's docstring). `rank` is the
    learner's rank and this process's runner index: its env seeds and random streams are its own."""

    def __init__(self, spec: ExperimentSpec, obs: ObsDims, act_dim: int, rank: int = 0):
        self.spec, self.rank = spec, rank
        self.obs_dims, self.act_dim = ObsDims.of(obs), act_dim
        self.learner = Learner(spec, self.obs_dims, act_dim, rank)
        self.device = self.learner.device
        self.envs = make_batched_env(spec, spec.runners.envs_per_runner, show_model_warnings=False)
        self._check_env(self.envs)
        self.num_envs = self.envs.num_envs
        algo = spec.algo
        if not isinstance(algo, OffPolicyKnobs):  # the spec refuses runtime.mode device for any other family
            raise SpecError(f"runtime.mode device trains off-policy algorithms; {algo.name} is not one")
        self.gamma = algo.gamma
        self.replay = DeviceReplay(
            max(algo.buffer_size // self.num_envs, 1), self.num_envs, self.obs_dims.full, act_dim, self.device,
            n_step=algo.n_step, gamma=algo.gamma,
        )
        self.policy = build_policy(algo, self.obs_dims, act_dim).to(self.device)
        self.policy_version = -1
        self.normalize_obs, self.normalize_reward = algo.normalize_obs, algo.normalize_reward
        # every random draw from a stream of the spec's seed; the rank stands where a runner's index does
        self.warm_up = self._generator(seeding.Stream.WARM_UP_ACTIONS, rank, 0)
        self.exploration = self._generator(seeding.Stream.EXPLORATION, rank, 0)
        self.sampling = self._generator(seeding.Stream.REPLAY, rank)
        self.obs = self.envs.reset(seed=seeding.train_env_seeds(spec.seed, rank, 0, 1)[0])
        self.episodes = EpisodeCounters(self.num_envs, self.envs.info_keys, self.device, self.gamma)
        self.replay_rows = 0  # drawable rows of the ring, as of the last iteration's read
        self.env_steps_seen = 0
        self.eval_envs: BatchedEnv | None = None

    def _generator(self, stream: seeding.Stream, *key: int) -> torch.Generator:
        seed = seeding.words(seeding.stream(self.spec.seed, stream, *key), 1)[0]
        return torch.Generator(self.device).manual_seed(seed)

    def _check_env(self, envs: BatchedEnv) -> None:
        if not _same_device(torch.device(envs.device), self.device):
            envs.close()
            raise SpecError(
                f"runtime.mode device keeps the env and the learner on one device, but env.device is "
                f"{self.spec.env.device!r} (the env's tensors are on {envs.device}) and the learner trains on "
                f"{self.device} (learners.gpus_per_learner={self.spec.learners.gpus_per_learner}); set env.device to "
                f"{'cuda' if self.device.type == 'cuda' else 'cpu'}, or use runtime.mode sync"
            )
        if (envs.obs_dims.full, envs.obs_dims.actor, envs.act_dim) != (
                self.obs_dims.full, self.obs_dims.actor, self.act_dim):
            envs.close()
            raise SpecError(
                f"env: this process's {self.spec.env.id!r} has {envs.obs_dims.full} observation features "
                f"({envs.obs_dims.actor} for the actor) and {envs.act_dim} actions, the driver's "
                f"{self.obs_dims.full} ({self.obs_dims.actor}) and {self.act_dim}: every process must run the same "
                "version of the env's code"
            )

    # ---- several learners: the Learner's process group --------------------------------------------
    def rendezvous_address(self, host: str) -> str:
        return self.learner.rendezvous_address(host)

    def join(self, address: str) -> None:
        self.learner.join(address)

    # ---- what the driver asks ---------------------------------------------------------------------
    def env_dims(self) -> tuple[ObsDims, int]:
        return self.envs.obs_dims, self.envs.act_dim

    def replay_size(self) -> int:
        """Transitions the ring can draw, as read at the end of the last iteration (no read of its own)."""
        return self.replay_rows

    def iterate(self, num_steps: int, random_actions: bool, learn: bool) -> tuple[ChunkStats, LearnerReport | None]:
        """Step all env copies `num_steps` times (uniform actions with `random_actions`), store every step
        in the ring, and with `learn` make the algorithm's `updates_per_iteration` updates on batches
        drawn from it. Nothing is read on the host until the end, and then once."""
        start = time.perf_counter()
        if not random_actions:
            self._refresh_policy()
        self.episodes.start(num_steps)
        moments = MomentSums(self.obs_dims.full, self.device, self.normalize_obs, self.normalize_reward)
        for _ in range(num_steps):
            obs = self.obs
            action = self._act(obs, random_actions)
            step = self.envs.step(to_bounds(action, self.envs.action_low, self.envs.action_high))
            self.replay.add(obs, action, step)
            moments.add(obs, self.episodes.step(step))
            self.obs = step.obs
        collect_s = time.perf_counter() - start
        norm_stats = [moments.merged(self.learner.world_size)]
        counts = torch.stack([self.episodes.valid_steps.to(torch.float64), self.replay.size.to(torch.float64)])
        to_read = torch.cat([counts, self.episodes.finish()])
        report: LearnerReport | None = None
        if learn:
            algo = self.spec.algo
            batch = self.replay.sample(algo.updates_per_iteration, algo.batch_size // self.learner.world_size,
                                       self.sampling)
            report = self.learner.update(norm_stats, DeviceSample(batch), also_read=to_read)
            values, report.read_with = report.read_with, []
        else:
            self.learner.merge_moments(norm_stats)
            values = to_read.tolist()  # the iteration's one host read
        valid_steps, replay_rows = int(values[0]), int(values[1])
        self.replay_rows = replay_rows
        self.env_steps_seen += valid_steps
        stats = ChunkStats(
            env_steps=valid_steps, episodes=self.episodes.decode(values[2:]),
            policy_version=self.policy_version if not random_actions else -1,
            moments=NormMoments(NO_OBS_MOMENTS, NO_RETURN_MOMENTS),  # merged here already, nothing for the driver
            collect_s=collect_s,
        )
        return stats, report

    def _act(self, obs: Tensor, random_actions: bool) -> Tensor:
        if random_actions:
            unit = torch.rand((self.num_envs, self.act_dim), generator=self.warm_up, device=self.device)
            return unit * 2.0 - 1.0
        return self.policy.act(obs, deterministic=False, generator=self.exploration)

    def _refresh_policy(self) -> None:
        """The acting module takes the learner's newest weights (once per version)."""
        if self.learner.weights_version != self.policy_version:
            state, version = self.learner.policy_state(self.device)  # device to device: no host copy
            self.policy.load_state_dict(state)
            self.policy_version = version

    def evaluate(self, episodes: int) -> dict[str, float]:
        """`episodes` deterministic episodes on a batched env of their own, one per copy, from the run's
        eval seed, so every evaluation faces the same starts; the metric names of `EnvRunner.evaluate`."""
        self._refresh_policy()
        if self.eval_envs is None or self.eval_envs.num_envs != episodes:
            if self.eval_envs is not None:
                self.eval_envs.close()
            self.eval_envs = make_batched_env(self.spec, episodes, show_model_warnings=False)
        return evaluate_first_episodes(self.policy, self.eval_envs, seeding.eval_env_seeds(self.spec.seed, 1)[0])

    # ---- weights and checkpoints ------------------------------------------------------------------
    def published_weights(self) -> tuple[dict[str, np.ndarray], int]:
        return self.learner.published_weights()

    def state_dict(self) -> LearnerState:
        return self.learner.state_dict()

    def load_state_dict(self, state: LearnerState) -> None:
        self.learner.load_state_dict(state)
        self.policy_version = -1  # the acting module takes the loaded weights before it acts again

    def parameters_vector(self) -> Tensor:
        return self.learner.parameters_vector()

    def runner_state(self, with_replay: bool) -> dict[str, Any]:
        """What the env side needs to go on where it stopped, as CPU tensors: the env's own state (or a
        flag that its episodes restart on resume: `BatchedEnv.state()` gave none), the observations to
        act on, the episode counters, the random streams, and the ring when `with_replay`."""
        env_state = self.envs.state()
        return {
            "num_envs": self.num_envs,
            "env": cpu_copies(env_state),
            "env_restarts": env_state is None,
            "obs": self.obs.to("cpu", copy=True),
            "episodes": self.episodes.state(),
            "generators": {name: generator.get_state() for name, generator in self._generators().items()},
            "replay": self.replay.state_dict() if with_replay else None,
            "replay_rows": self.replay_rows,
        }

    def load_runner_state(self, state: dict[str, Any]) -> None:
        if int(state["num_envs"]) != self.num_envs:
            raise SpecError(
                f"the checkpoint's device learner stepped {state['num_envs']} env copies, this run "
                f"{self.num_envs} (runners.envs_per_runner): resume with the same number"
            )
        for name, generator in self._generators().items():
            generator.set_state(state["generators"][name])
        if state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])
            self.replay_rows = int(state["replay_rows"])
        if state["env"] is None:  # the env could not be saved: it starts new episodes here
            self.replay.cut()  # no n-step window reaches from the old episodes into the new ones
            return
        self.envs.load_state(state["env"])
        self.obs = state["obs"].to(self.device, copy=True)
        self.episodes.load_state(state["episodes"])

    def _generators(self) -> dict[str, torch.Generator]:
        return {"warm_up": self.warm_up, "exploration": self.exploration, "sampling": self.sampling}

    def close(self) -> None:
        for envs in (self.envs, self.eval_envs):
            if envs is not None:
                envs.close()


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
