"""What the batched runner and the device learner keep between their env steps, as tensors on the
env's device: each copy's episode so far and the episodes that end (`EpisodeCounters`), the sums
that become the normalizers' moments (`MomentSums`), each eval copy's first episode
(`FirstEpisodes`) and n-step windows (`TensorNStep`). Nothing here reads a value on the host while
stepping; what a chunk or an iteration reports is read once, at its end."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from aa_ray import metric_names as m
from aa_ray.envs.batched import BatchedEnv, BatchedStep
from aa_ray.envs.info_metrics import metric_name
from aa_ray.nets.policy import to_bounds
from aa_ray.records import EpisodeStats, NormMoments

EPISODES_READ = 256  # finished episodes per iteration read one by one (more than the driver's recent window)
NO_OBS_MOMENTS = (0, None, None)
NO_RETURN_MOMENTS = (0, 0.0, 1.0, 0.0)


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


def cpu_copies(tree: Any) -> Any:
    """CPU copies (also of CPU tensors: the env goes on changing after a checkpoint is taken)."""
    if isinstance(tree, Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: cpu_copies(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(cpu_copies(value) for value in tree)
    return tree


def on_host(moments: NormMoments) -> NormMoments:
    """`MomentSums.merged`'s moments as host numbers (numpy arrays, floats), for a runner's chunk stats,
    which travel to the learners in other processes."""
    (obs_rows, obs_mean, obs_var), (return_rows, *returns) = moments
    obs = (obs_rows, None, None) if obs_mean is None else (
        obs_rows, obs_mean.cpu().numpy(), obs_var.cpu().numpy())
    return NormMoments(obs, (return_rows, *(float(value) for value in returns)))


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


def n_step_windows(reward: Tensor, done: Tensor, valid: Tensor, powers: Tensor) -> tuple[Tensor, Tensor]:
    """n-step returns of windows of consecutive steps of one env copy each, (rows, n), whose first step
    is a real transition: R = sum_{i<k} gamma^i r_i (`powers` = gamma^i) and k, the window's length.
    A window stops after the step that ended an episode and before a step that is no transition
    (`valid` false), so it never reaches into the next episode. Same target as `runtime.nstep`."""
    ended_before = torch.zeros_like(done)
    ended_before[:, 1:] = done[:, :-1]
    kept = (valid & ~ended_before).cumprod(dim=1)
    kept[:, 0] = 1
    return (reward * kept * powers).sum(dim=1), kept.sum(dim=1)


class TensorNStep:
    """n-step transitions for all N copies at once (`n_step_windows`). A step's transition is complete
    n - 1 steps later (or sooner: its window stops at the episode's end), so each step emits the
    transitions of the step n - 1 before it: s_t, a_t, R, the k-th step's next observation and flags,
    discount gamma^k."""

    def __init__(self, n_step: int, gamma: float):
        self.n_step, self.gamma = n_step, gamma
        self.window: deque[dict[str, Tensor]] = deque()

    def push(self, row: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """Add one step of every copy; returns the transitions (N rows, with `valid` and `discount`)
        of the step n - 1 before it, once there is one."""
        self.window.append(row)
        if len(self.window) < self.n_step:
            return None
        out = self._emit()
        self.window.popleft()
        return out

    def _emit(self) -> dict[str, Tensor]:
        first = self.window[0]
        stacked = {name: torch.stack([row[name] for row in self.window], dim=1)  # (N, n, ...)
                   for name in ("reward", "next_obs", "terminated", "truncated", "valid")}
        powers = self.gamma ** torch.arange(self.n_step, dtype=first["reward"].dtype, device=first["reward"].device)
        done = stacked["terminated"] | stacked["truncated"]
        ret, length = n_step_windows(stacked["reward"], done, stacked["valid"], powers)
        last = (length - 1).unsqueeze(1)  # each copy's window's last step
        next_obs = stacked["next_obs"].gather(1, last.unsqueeze(2).expand(-1, 1, stacked["next_obs"].shape[2]))
        return {"obs": first["obs"], "action": first["action"], "reward": ret, "next_obs": next_obs.squeeze(1),
                "terminated": stacked["terminated"].gather(1, last).squeeze(1),
                "truncated": stacked["truncated"].gather(1, last).squeeze(1), "valid": first["valid"],
                "discount": self.gamma ** length.to(first["reward"].dtype)}

    def state(self) -> list[dict[str, Tensor]]:
        return cpu_copies(list(self.window))

    def load_state(self, rows: list[dict[str, Tensor]], device: torch.device) -> None:
        self.window = deque({k: v.to(device) for k, v in row.items()} for row in rows)


def evaluate_first_episodes(policy: Any, envs: BatchedEnv, seed: int) -> dict[str, float]:
    """Each copy's first episode with the policy's deterministic actions, from `reset(seed)`: the
    metrics of `EnvRunner.evaluate` (eval/return, eval/length, eval/<task metric>). Evaluation may
    read the host each step (whether every episode ended): it is not the training loop."""
    obs = envs.reset(seed=seed)
    first = FirstEpisodes(envs.num_envs, envs.info_keys, envs.device)
    while not bool(first.finished.all()):
        step = envs.step(to_bounds(policy.act(obs, deterministic=True), envs.action_low, envs.action_high))
        first.step(step)
        obs = step.obs
    return first.metrics()
