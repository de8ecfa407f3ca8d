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
episode count); the newest `EPISODES_READ` of them with their own return, length and info, any
older ones of the same iteration with their means (thousands of copies can end episodes in one
step, and the driver's train/* metrics average only the newest few), so the read stays small.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from aa_ray import metric_names as m
from aa_ray import seeding
from aa_ray.algos.registry import build_policy
from aa_ray.envs.batched import BatchedEnv, BatchedStep
from aa_ray.envs.info_metrics import metric_name
from aa_ray.envs.make import make_batched_env
from aa_ray.errors import SpecError
from aa_ray.nets.policy import ObsDims, to_bounds
from aa_ray.records import ChunkStats, DeviceSample, EpisodeStats, LearnerReport, NormMoments
from aa_ray.runtime.device_replay import DeviceReplay
from aa_ray.runtime.learner import Learner
from aa_ray.spec.experiment import ExperimentSpec

EPISODES_READ = 256  # finished episodes per iteration read one by one (more than the driver's recent window)
NO_OBS_MOMENTS = (0, None, None)
NO_RETURN_MOMENTS = (0, 0.0, 1.0, 0.0)


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
        self.gamma = algo.gamma
        self.replay = DeviceReplay(
            max(algo.buffer_size // self.num_envs, 1), self.num_envs, self.obs_dims.full, act_dim, self.device,
            n_step=getattr(algo, "n_step", 1), gamma=algo.gamma,
        )
        self.policy = build_policy(algo, self.obs_dims, act_dim).to(self.device)
        self.policy_version = -1
        self.normalize_obs = bool(getattr(algo, "normalize_obs", False))
        self.normalize_reward = bool(getattr(algo, "normalize_reward", False))
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
        envs = self.eval_envs
        obs = envs.reset(seed=seeding.eval_env_seeds(self.spec.seed, 1)[0])
        first = FirstEpisodes(episodes, envs.info_keys, self.device)
        while True:
            action = self.policy.act(obs, deterministic=True)
            step = envs.step(to_bounds(action, envs.action_low, envs.action_high))
            first.step(step)
            obs = step.obs
            if bool(first.finished.all()):  # evaluation may read each step: it is not the training loop
                break
        return first.metrics()

    # ---- weights and checkpoints ------------------------------------------------------------------
    def policy_state(self) -> tuple[dict[str, Tensor], int]:
        return self.learner.policy_state()

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
            "env": _to_cpu(env_state),
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


class EpisodeCounters:
    """Each env copy's running return, length and discounted return (for reward normalization) on the
    device, and the episodes that end during an iteration of `steps` steps: (steps, N) buffers
    compacted at the end into one vector for the iteration's host read (`finish`, `decode`).

    An episode ends at a row that is terminated or truncated; its return and length count the rows
    that are real transitions (`valid`), as `EnvRunner`'s episode tracker does."""

    def __init__(self, num_envs: int, info_keys: Sequence[str], device: torch.device, gamma: float):
        self.num_envs, self.info_keys, self.device, self.gamma = num_envs, tuple(info_keys), device, gamma
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.discounted = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.valid_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.t = 0
        self.capacity = 0

    def start(self, steps: int) -> None:
        shape, on = (steps, self.num_envs), {"device": self.device}
        self.t, self.capacity = 0, min(steps * self.num_envs, EPISODES_READ)
        self.ended = torch.zeros(shape, dtype=torch.bool, **on)
        # columns of an ended row: return, length, then each info key's value and whether it was given
        self.values = torch.zeros((*shape, 2 + 2 * len(self.info_keys)), dtype=torch.float64, **on)
        self.valid_steps = torch.zeros((), dtype=torch.int64, **on)

    def step(self, step: BatchedStep) -> Tensor:
        """Count one env step; returns the discounted returns after it (the reward normalizer's samples)."""
        t, valid = self.t, step.valid
        done = step.terminated | step.truncated
        reward = torch.where(valid, step.reward.to(torch.float64), 0.0)
        self.returns += reward
        self.lengths += valid
        self.discounted = self.gamma * self.discounted + reward
        self.valid_steps += valid.sum()
        self.ended[t] = done
        row = self.values[t]
        row[:, 0], row[:, 1] = self.returns, self.lengths
        for k, key in enumerate(self.info_keys):
            given = step.episode_info.get(key)
            if given is not None:
                row[:, 2 + 2 * k] = given[0]
                row[:, 3 + 2 * k] = given[1]
        discounted = self.discounted
        keep = ~done
        self.returns *= keep
        self.lengths *= keep
        self.discounted = self.discounted * keep
        self.t = t + 1
        return discounted

    def finish(self) -> Tensor:
        """The iteration's episodes as one float64 vector on the device: [count, older count, older
        sums (columns), the newest `capacity` rows (columns each, right-aligned)]."""
        ended, values = self.ended[: self.t].reshape(-1), self.values[: self.t].reshape(-1, self.values.shape[-1])
        count = ended.sum()
        order = ended.cumsum(0) - 1  # each ended row's place in time order (then env order)
        newest = ended & (order >= count - self.capacity)
        older = ended & ~newest
        # the newest rows go to slots [capacity - min(count, capacity), capacity); the rest to a spare slot
        slot = torch.where(newest, order - (count - self.capacity), self.capacity)
        rows = torch.zeros((self.capacity + 1, values.shape[-1]), dtype=torch.float64, device=self.device)
        rows[slot] = values
        older_sums = (values * older.unsqueeze(1)).sum(0)
        return torch.cat([torch.stack([count.to(torch.float64), older.sum().to(torch.float64)]), older_sums,
                          rows[: self.capacity].reshape(-1)])

    def decode(self, read: Sequence[float]) -> list[EpisodeStats]:
        """`finish`'s vector, read on the host, as the iteration's episodes in time order."""
        width = 2 + 2 * len(self.info_keys)
        count, older = int(read[0]), int(read[1])
        episodes: list[EpisodeStats] = []
        if older:
            sums = read[2 : 2 + width]
            info = {}
            for k, key in enumerate(self.info_keys):
                given = sums[3 + 2 * k]
                if given:  # the mean over the older episodes that gave the key
                    info[key] = sums[2 + 2 * k] / given
            episodes += [EpisodeStats(sums[0] / older, sums[1] / older, info)] * older
        rows = read[2 + width:]
        for slot in range(self.capacity - (count - older), self.capacity):
            row = rows[slot * width : (slot + 1) * width]
            info = {key: row[2 + 2 * k] for k, key in enumerate(self.info_keys) if row[3 + 2 * k]}
            episodes.append(EpisodeStats(row[0], row[1], info))
        return episodes

    def state(self) -> dict[str, Tensor]:
        return {name: getattr(self, name).to("cpu", copy=True) for name in ("returns", "lengths", "discounted")}

    def load_state(self, state: dict[str, Tensor]) -> None:
        for name in ("returns", "lengths", "discounted"):  # copies: the counters are added to in place
            setattr(self, name, state[name].to(self.device, torch.float64, copy=True))


class MomentSums:
    """Sums of an iteration's observations and discounted returns on the device, turned into the
    normalizers' moments once (all-reduced over the learners, so every rank merges the same ones).
    Counts are every row acted on, known on the host without a read."""

    def __init__(self, obs_dim: int, device: torch.device, track_obs: bool, track_returns: bool):
        self.track_obs, self.track_returns = track_obs, track_returns
        self.rows = 0
        on = {"dtype": torch.float64, "device": device}
        self.obs_sum, self.obs_squares = torch.zeros(obs_dim, **on), torch.zeros(obs_dim, **on)
        self.return_sums = torch.zeros(2, **on)  # sum, sum of squares
        self.return_max = torch.zeros((), **on)

    def add(self, obs: Tensor, discounted: Tensor) -> None:
        self.rows += obs.shape[0]
        if self.track_obs:
            wide = obs.to(torch.float64)
            self.obs_sum += wide.sum(0)
            self.obs_squares += wide.square().sum(0)
        if self.track_returns:
            self.return_sums += torch.stack([discounted.sum(), discounted.square().sum()])
            self.return_max = torch.maximum(self.return_max, discounted.abs().max())

    def merged(self, world_size: int) -> NormMoments:
        if not self.rows or not (self.track_obs or self.track_returns):
            return NormMoments(NO_OBS_MOMENTS, NO_RETURN_MOMENTS)
        sums = torch.cat([self.obs_sum, self.obs_squares, self.return_sums])
        peak = self.return_max.clone()
        if world_size > 1:  # one sum and one max over the learners
            dist.all_reduce(sums)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        rows = self.rows * world_size
        features = self.obs_sum.shape[0]
        obs_mean = sums[:features] / rows
        obs_var = (sums[features : 2 * features] / rows - obs_mean.square()).clamp_min(0.0)
        return_mean = sums[-2] / rows
        return_var = (sums[-1] / rows - return_mean.square()).clamp_min(0.0)
        return NormMoments(
            (rows, obs_mean, obs_var) if self.track_obs else NO_OBS_MOMENTS,
            (rows, return_mean, return_var, peak) if self.track_returns else NO_RETURN_MOMENTS,
        )


class FirstEpisodes:
    """Each eval copy's first episode: its return, length and info at its end, on the device."""

    def __init__(self, num_envs: int, info_keys: Sequence[str], device: torch.device):
        self.info_keys = tuple(info_keys)
        on = {"dtype": torch.float64, "device": device}
        self.returns, self.lengths = torch.zeros(num_envs, **on), torch.zeros(num_envs, **on)
        self.finished = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.info = torch.zeros((len(self.info_keys), num_envs), **on)
        self.info_given = torch.zeros((len(self.info_keys), num_envs), dtype=torch.bool, device=device)

    def step(self, step: BatchedStep) -> None:
        running = ~self.finished
        counted = step.valid & running
        self.returns += torch.where(counted, step.reward.to(torch.float64), 0.0)
        self.lengths += counted
        ends = (step.terminated | step.truncated) & running
        for k, key in enumerate(self.info_keys):
            given = step.episode_info.get(key)
            if given is not None:
                self.info[k] = torch.where(ends, given[0].to(torch.float64), self.info[k])
                self.info_given[k] |= ends & given[1]
        self.finished |= ends

    def metrics(self) -> dict[str, float]:
        given = self.info_given.to(torch.float64)
        means = torch.cat([torch.stack([self.returns.mean(), self.lengths.mean()]),
                           (self.info * given).sum(1) / given.sum(1).clamp_min(1.0), given.sum(1)]).tolist()
        keys = len(self.info_keys)
        out = {m.EVAL_RETURN: means[0], m.EVAL_LENGTH: means[1]}
        for k, key in enumerate(self.info_keys):
            if means[2 + keys + k]:
                out[m.EVAL_PREFIX + metric_name(key)] = means[2 + k]
        return out


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def _to_cpu(tree: Any) -> Any:
    """CPU copies (also of CPU tensors: the env goes on changing after a checkpoint is taken)."""
    if isinstance(tree, Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: _to_cpu(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_cpu(value) for value in tree)
    return tree
