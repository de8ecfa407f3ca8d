"""What a runner of a batched env keeps between its env steps, as tensors on the env's device:
each copy's episode so far, the discounted returns that feed reward normalization, and the n-step
windows. Nothing here reads a value on the host while stepping; a chunk's episodes and moments are
read once, at its end (`ChunkEpisodes.finish`)."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import Tensor

from aa_ray.envs.batched import BatchedStep
from aa_ray.records import EpisodeStats, ObsMoments, ReturnMoments


class ChunkEpisodes:
    """Each env copy's running return and length, and what ended during a chunk of `steps` steps:
    (steps, N) buffers filled on the device, read on the host once per chunk."""

    def __init__(self, num_envs: int, device: torch.device, gamma: float):
        self.gamma = gamma
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.discounted = torch.zeros(num_envs, dtype=torch.float64, device=device)  # raw rewards, for normalizing
        self._chunk: dict[str, Any] | None = None

    def start(self, steps: int) -> None:
        n, device = self.returns.shape[0], self.returns.device
        self._chunk = {
            "t": 0,
            "ended": torch.zeros(steps, n, dtype=torch.bool, device=device),
            "episode_return": torch.zeros(steps, n, dtype=torch.float64, device=device),
            "length": torch.zeros(steps, n, dtype=torch.int64, device=device),
            "discounted": torch.zeros(steps, n, dtype=torch.float64, device=device),
            "counted": torch.zeros(steps, n, dtype=torch.bool, device=device),
            "info": {},
        }

    def step(self, step: BatchedStep) -> None:
        chunk, t = self._chunk, self._chunk["t"]
        valid, done = step.valid, step.terminated | step.truncated
        reward = step.reward.to(torch.float64)
        self.returns += torch.where(valid, reward, 0.0)
        self.lengths += valid
        self.discounted = self.gamma * self.discounted + torch.where(valid, reward, 0.0)
        chunk["discounted"][t], chunk["counted"][t] = self.discounted, valid
        chunk["ended"][t] = done
        chunk["episode_return"][t], chunk["length"][t] = self.returns, self.lengths
        for key, (values, mask) in step.episode_info.items():
            seen = chunk["info"].setdefault(key, (torch.zeros_like(chunk["discounted"]),
                                                 torch.zeros_like(chunk["ended"])))
            seen[0][t], seen[1][t] = values.to(torch.float64), mask
        self.returns = torch.where(done, 0.0, self.returns)
        self.lengths = torch.where(done, 0, self.lengths)
        self.discounted = torch.where(done, 0.0, self.discounted)
        chunk["t"] = t + 1

    def finish(self) -> tuple[list[EpisodeStats], ReturnMoments]:
        """The episodes that ended in the chunk (in time order, then env order) and the moments of
        the discounted returns seen: one read on the host."""
        chunk, self._chunk = self._chunk, None
        ended = chunk["ended"].cpu()
        at_end = {name: chunk[name][ended.to(chunk[name].device)].cpu().tolist()
                  for name in ("episode_return", "length")}
        infos = {key: (values[ended.to(values.device)].cpu().tolist(), mask[ended.to(mask.device)].cpu().tolist())
                 for key, (values, mask) in chunk["info"].items()}
        episodes = []
        for k, (episode_return, length) in enumerate(zip(at_end["episode_return"], at_end["length"], strict=True)):
            info = {key: value[k] for key, (value, mask) in infos.items() if mask[k]}
            episodes.append(EpisodeStats(float(episode_return), float(length), info))
        seen = chunk["discounted"][chunk["counted"]]
        if seen.numel() == 0:
            return episodes, (0, 0.0, 1.0, 0.0)
        moments = torch.stack([seen.mean(), seen.var(unbiased=False), seen.abs().max()]).cpu().tolist()
        return episodes, (int(seen.numel()), *moments)

    def state(self) -> dict[str, Tensor]:
        return {"returns": self.returns.cpu(), "lengths": self.lengths.cpu(), "discounted": self.discounted.cpu()}

    def load_state(self, state: dict[str, Tensor]) -> None:
        device = self.returns.device
        self.returns, self.lengths = state["returns"].to(device), state["lengths"].to(device)
        self.discounted = state["discounted"].to(device)


def tensor_obs_moments(obs: Tensor) -> ObsMoments:
    """`records.obs_moments` of a (rows, features) block of observations on a device."""
    if obs.shape[0] == 0:
        return 0, None, None
    flat = obs.to(torch.float64)
    return int(flat.shape[0]), flat.mean(0).cpu().numpy(), flat.var(0, unbiased=False).cpu().numpy()


class TensorNStep:
    """n-step transitions for all N copies at once. A step's transition is complete n - 1 steps
    later (or sooner: its window stops at the episode's end, or before a row that is not a real
    transition), so each step emits the transitions of the step n - 1 before it. Same target as
    `runtime.nstep`: R = sum_{i<k} gamma^i r_{t+i}, discount gamma^k, s_{t+k} and the flags of the
    k-th step."""

    FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "valid")

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
        ret = torch.zeros_like(first["reward"])
        next_obs, terminated, truncated = first["next_obs"], first["terminated"], first["truncated"]
        discount = torch.full_like(first["reward"], self.gamma)
        open_ = first["valid"].clone()
        for k, row in enumerate(self.window):
            if k > 0:
                open_ = open_ & row["valid"]
                next_obs = torch.where(open_[:, None], row["next_obs"], next_obs)
                terminated = torch.where(open_, row["terminated"], terminated)
                truncated = torch.where(open_, row["truncated"], truncated)
                discount = torch.where(open_, self.gamma ** (k + 1), discount)
            ret = ret + torch.where(open_, self.gamma**k * row["reward"], 0.0)
            open_ = open_ & ~(row["terminated"] | row["truncated"])
        return {"obs": first["obs"], "action": first["action"], "reward": ret, "next_obs": next_obs,
                "terminated": terminated, "truncated": truncated, "valid": first["valid"], "discount": discount}

    def state(self) -> list[dict[str, Tensor]]:
        return [{k: v.cpu() for k, v in row.items()} for row in self.window]

    def load_state(self, rows: list[dict[str, Tensor]], device: torch.device) -> None:
        self.window = deque({k: v.to(device) for k, v in row.items()} for row in rows)
