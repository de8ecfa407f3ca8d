"""BatchedRunner (`runners.kind: batched`): one batched env of E copies (`env.batched`: a gymnasium
VectorEnv, EnvPool, or a torch env in the Isaac Lab / mjlab shape) stepped in one call, with the
current policy acting on the env's own tensors.

Everything between the env's step and the end of a chunk stays tensors on the env's device:
acting, the episode bookkeeping, n-step windows (`tensor_steps`). A chunk is handed to the replay
actor as one `Transitions` record on the host, read in one transfer; its episodes and moments in
another. The env's same-step autoreset (`aa_ray.envs.batched`) means no step is lost to resets:
every row with `valid` set is a real transition.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from aa_ray import seeding
from aa_ray.algos.contract import OnPolicyActor
from aa_ray.algos.registry import build_policy
from aa_ray.envs import RENDER_BACKEND_ERRORS
from aa_ray.envs.batched import BatchedEnv
from aa_ray.envs.make import make_batched_env
from aa_ray.nets.policy import PolicyState, state_tensors, to_bounds
from aa_ray.records import ChunkStats, ObsDims, RolloutChunk, Transitions
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.runtime.run_files import cannot_render, gif_bytes
from aa_ray.runtime.tensor_steps import (
    EpisodeCounters,
    MomentSums,
    TensorNStep,
    cpu_copies,
    evaluate_first_episodes,
    on_host,
)
from aa_ray.spec.experiment import ExperimentSpec

NO_VIDEO = ("eval video skipped: this batched env's source renders no frames (of env.batched, unilab does); set "
            "eval.video: false")


class BatchedRunner:
    """Owns one batched env of E copies and acts with the latest published policy weights."""

    def __init__(self, spec: ExperimentSpec, index: int, incarnation: int = 0):
        self.spec, self.index, self.incarnation = spec, index, incarnation
        self.num_envs = spec.runners.envs_per_runner
        self.envs: BatchedEnv = make_batched_env(spec, self.num_envs, show_model_warnings=False)
        self.device = self.envs.device
        self.obs_dims, self.act_dim = self.envs.obs_dims, self.envs.act_dim
        self.policy = build_policy(spec.algo, self.obs_dims, self.act_dim).to(self.device)
        self.policy_version = -1
        self.warm_up = torch.Generator(self.device).manual_seed(seeding.warm_up_seed(spec.seed, index, incarnation))
        self.generator = torch.Generator(self.device).manual_seed(
            seeding.exploration_seed(spec.seed, index, incarnation))
        self.obs = self.envs.reset(seed=seeding.train_env_seeds(spec.seed, index, incarnation, 1)[0])
        self.gamma = spec.algo.gamma
        self.episodes = EpisodeCounters(self.num_envs, self.envs.info_keys, self.device, self.gamma)
        self.nstep = TensorNStep(spec.algo.n_step, self.gamma)
        self.eval_envs: BatchedEnv | None = None
        self.metrics = RunMetrics(run_tag(spec), runner=index)
        self.weights_s = 0.0

    def env_dims(self) -> tuple[ObsDims, int]:
        return self.obs_dims, self.act_dim

    def close(self) -> None:
        """As EnvRunner.close: the envs closed and let go of."""
        for envs in (self.envs, self.eval_envs):
            if envs is not None:
                envs.close()
        self.envs = self.eval_envs = None

    def set_weights(self, state: PolicyState, version: int) -> None:
        if version != self.policy_version:
            start = time.perf_counter()
            self.policy.load_state_dict(state_tensors(state))  # copies onto the policy's device
            self.policy_version = version
            self.weights_s += time.perf_counter() - start

    def to_env_action(self, action: Tensor) -> Tensor:
        return to_bounds(action, self.envs.action_low, self.envs.action_high)

    def sample(self, num_steps: int, random_actions: bool, weights: PolicyState | None = None,
               version: int = 0) -> tuple[Transitions, ChunkStats]:
        """Step all E copies `num_steps` times, first loading `weights` (of `version`) if given; the
        chunk's real transitions (n-step ones with algo.n_step > 1) on the host, and its stats."""
        if weights is not None:
            self.set_weights(weights, version)
        start = time.perf_counter()
        self.episodes.start(num_steps)
        moments = MomentSums(self.obs_dims.full, self.device, track_obs=True, track_returns=True)
        rows: list[dict[str, Tensor]] = []
        for _ in range(num_steps):
            if random_actions:
                action = torch.rand((self.num_envs, self.act_dim), generator=self.warm_up, device=self.device) * 2 - 1
            else:
                action = self.policy.act(self.obs, deterministic=False, generator=self.generator)
            step = self.envs.step(self.to_env_action(action))
            moments.add(self.obs, self.episodes.step(step))
            row = {"obs": self.obs, "action": action, "reward": step.reward, "next_obs": step.next_obs,
                   "terminated": step.terminated, "truncated": step.truncated, "valid": step.valid}
            emitted = self.nstep.push(row) if self.nstep.n_step > 1 else {**row, "discount": None}
            if emitted is not None:
                rows.append(emitted)
            self.obs = step.obs
        return self._transitions(rows), self._chunk_stats(moments, start)

    def _transitions(self, rows: list[dict[str, Tensor]]) -> Transitions:
        """The valid rows of the chunk's steps as host arrays, one transfer per field."""
        if not rows:
            return Transitions.empty(0, self.obs_dims.full, self.act_dim)
        valid = torch.stack([row["valid"] for row in rows]).reshape(-1)

        def column(name: str) -> Tensor:
            stacked = torch.stack([row[name] for row in rows])
            return stacked.reshape(-1, *stacked.shape[2:])[valid].to(torch.float32)

        discount = (column("discount") if rows[0]["discount"] is not None
                    else torch.full((int(valid.sum()),), self.gamma, device=self.device))
        fields = [column(name) for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated")]
        return Transitions(*(field.cpu().numpy() for field in (*fields, discount.to(torch.float32))))

    def _chunk_stats(self, moments: MomentSums, start: float) -> ChunkStats:
        """The chunk's counts, episodes (one read of the counters), moments and timings; the Ray metrics."""
        read = torch.cat([self.episodes.valid_steps.reshape(1).to(torch.float64), self.episodes.finish()]).tolist()
        env_steps = int(read[0])
        stats = ChunkStats(env_steps, self.episodes.decode(read[1:]), self.policy_version, on_host(moments.merged(1)),
                           collect_s=time.perf_counter() - start, weights_s=self.weights_s)
        self.weights_s = 0.0
        self.metrics.inc("aa_ray_env_steps", env_steps)
        self.metrics.set("aa_ray_env_steps_per_s", env_steps / max(stats.collect_s, 1e-9))
        return stats

    def sample_rollout(self, num_steps: int) -> tuple[RolloutChunk, ChunkStats]:
        """On-policy: `num_steps` steps of every copy, (num_steps, E, ...) on the host. A row that is
        not a real transition (a source that cannot say what a truncated episode's last observation
        was) is bootstrapped from its own observation's value."""
        start = time.perf_counter()
        self.episodes.start(num_steps)
        moments = MomentSums(self.obs_dims.full, self.device, track_obs=True, track_returns=True)
        policy: OnPolicyActor = self.policy
        names = ("obs", "action", "log_prob", "reward", "next_obs", "terminated", "truncated")
        steps: dict[str, list[Tensor]] = {name: [] for name in names}
        for _ in range(num_steps):
            action, log_prob = policy.explore(self.obs, self.generator)
            step = self.envs.step(self.to_env_action(action.clamp(-policy.action_limit, policy.action_limit)))
            moments.add(self.obs, self.episodes.step(step))
            next_obs = torch.where(step.valid[:, None], step.next_obs, self.obs)
            for name, value in (("obs", self.obs), ("action", action), ("log_prob", log_prob),
                                ("reward", step.reward), ("next_obs", next_obs),
                                ("terminated", step.terminated), ("truncated", step.truncated | ~step.valid)):
                steps[name].append(value)
            self.obs = step.obs
        stacked = {name: torch.stack(values).to(torch.float32) for name, values in steps.items()}
        shape = (num_steps, self.num_envs)
        flat_obs = stacked["obs"].reshape(-1, self.obs_dims.full)
        value = policy.value(flat_obs).reshape(shape)
        next_value = policy.value(stacked["next_obs"].reshape(-1, self.obs_dims.full)).reshape(shape)
        chunk = RolloutChunk(*(t.cpu().numpy() for t in (
            stacked["obs"], stacked["action"], stacked["log_prob"], value, stacked["reward"], next_value,
            stacked["terminated"], stacked["truncated"])))
        return chunk, self._chunk_stats(moments, start)

    def evaluate(self, num_episodes: int) -> dict[str, float]:
        """`num_episodes` deterministic episodes, one per copy of a separate batched env reset with
        the run's eval seed (every evaluation faces the same starts)."""
        if self.eval_envs is None or self.eval_envs.num_envs != num_episodes:
            if self.eval_envs is not None:
                self.eval_envs.close()
            self.eval_envs = make_batched_env(self.spec, num_episodes, show_model_warnings=False)
        return evaluate_first_episodes(self.policy, self.eval_envs, seeding.eval_env_seeds(self.spec.seed, 1)[0])

    def record_video(self, max_frames: int) -> tuple[bytes | None, str | None]:
        """The first evaluation episode of one copy (the video seed, deterministic policy), drawn where the
        env's source renders (`render_frame`: UniLab's tasks), as GIF bytes; (None, reason) otherwise or
        when this machine cannot render (no GL backend for MUJOCO_GL): training goes on."""
        if not hasattr(self.envs, "render_frame"):
            return None, NO_VIDEO
        envs = make_batched_env(self.spec, 1, show_model_warnings=False)
        try:
            obs = envs.reset(seed=seeding.video_seed(self.spec.seed))
            try:
                frames = [envs.render_frame()]
            except RENDER_BACKEND_ERRORS as err:
                return None, cannot_render(self.spec.env.id, err)
            while len(frames) < max_frames:
                step = envs.step(self.to_env_action(self.policy.act(obs, deterministic=True)))
                frames.append(envs.render_frame())
                if bool(step.terminated[0] | step.truncated[0]):
                    break
                obs = step.obs
            fps = 1.0 / getattr(envs, "step_dt", 0.05)
        finally:
            envs.close()
        return gif_bytes(frames, fps), None

    def state(self) -> dict[str, Any]:
        """What the next `sample` depends on: generators, the current observations, episode and n-step
        state, and the env's own state where its source can give one (`env` None: episodes restart on
        resume, and `env_restarts` says so)."""
        env_state = cpu_copies(self.envs.state())  # a GPU env's state loads on any machine
        return {
            "kind": "batched",
            "warm_up_rng": self.warm_up.get_state(),
            "torch_rng": self.generator.get_state(),
            "obs": cpu_copies(self.obs),  # copies: the env may write its observations in place
            "episodes": self.episodes.state(),
            "nstep": self.nstep.state(),
            "env": env_state,
            "env_restarts": env_state is None,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.warm_up.set_state(state["warm_up_rng"])
        self.generator.set_state(state["torch_rng"])
        if state.get("env") is None or state["obs"].shape[0] != self.num_envs:
            return  # the env's copies start afresh (the checkpoint says so: env_restarts)
        self.envs.load_state(state["env"])
        self.obs = state["obs"].to(self.device)
        self.episodes.load_state(state["episodes"])
        self.nstep.load_state(state["nstep"], self.device)
