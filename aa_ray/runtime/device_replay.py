"""A replay ring that lives on the learner's device (`runtime.mode: device`).

Shaped (T, N, ...): one time slice per env step of all N env copies, the layout active-adaptation's
replay uses, so `add` is one write of whole tensors and an env copy's steps stay in order down its
column. n-step returns are not assembled on the way in (as `aa_ray.runtime.nstep` does in an env
runner) but when a row is drawn: the sampler walks up to n slices forward in the row's column,
stopping after the step where the episode ended (terminated or truncated) and before a row that is
no real transition (`valid` false), and returns

    R = sum_{j<k} gamma^j r_{t+j},  next_obs of step t+k-1,  terminated of step t+k-1,  discount = gamma^k

so a truncation bootstraps from its true final observation and a termination does not bootstrap.
A row can be drawn once its window is whole: it is valid, and its n-1 successors have been written
(the newest n-1 slices wait for the next adds). Everything, the draw included, runs on the device
from the caller's `torch.Generator`; nothing is read on the host.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aa_ray.envs.batched import BatchedStep
from aa_ray.records import Batch
from aa_ray.runtime.tensor_steps import n_step_windows

_RING_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "valid")


class ReplayShapeError(ValueError):
    """A saved ring that does not fit this run's ring (another env count, capacity or dims)."""


class DeviceReplay:
    """`capacity_steps` (T) time slices of `num_envs` (N) transitions on `device`; see the module's
    docstring for what a sample holds."""

    def __init__(self, capacity_steps: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device | str,
                 n_step: int = 1, gamma: float = 0.99):
        if capacity_steps < n_step:
            raise ValueError(
                f"the replay ring holds {capacity_steps} steps of each env, fewer than algo.n_step ({n_step}): raise "
                "algo.buffer_size to at least n_step x the env copies of a learner process"
            )
        self.capacity, self.num_envs = capacity_steps, num_envs
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)
        self.n_step, self.gamma = n_step, gamma
        shape, on = (capacity_steps, num_envs), {"device": self.device}
        self.obs = torch.zeros((*shape, obs_dim), **on)
        self.action = torch.zeros((*shape, act_dim), **on)
        self.reward = torch.zeros(shape, **on)
        self.next_obs = torch.zeros((*shape, obs_dim), **on)
        self.terminated = torch.zeros(shape, dtype=torch.bool, **on)
        self.truncated = torch.zeros(shape, dtype=torch.bool, **on)
        self.valid = torch.zeros(shape, dtype=torch.bool, **on)
        # per slice: how many of its rows are valid, and each row's count of valid rows up to it; a draw
        # picks a slice by the first and the row inside it by the second (a cumulative count over all
        # T x N rows would be redone after every add: 10 ms at a million rows on one CPU thread)
        self.slice_rows = torch.zeros(capacity_steps, dtype=torch.int64, **on)
        self.rows_so_far = torch.zeros(shape, dtype=torch.int32, **on)
        # host bookkeeping: which slices hold data is known without looking at the device
        self.cursor = 0  # the slice the next `add` writes
        self.slices = 0  # slices written, at most `capacity`
        self.steps_added = 0  # slices ever written
        self._drawable_slices: Tensor | None = None  # cumulative count of drawable rows by slice, until the next add
        self._search_steps = max(num_envs - 1, 1).bit_length()  # halvings that find a row among N
        self._powers = gamma ** torch.arange(n_step, dtype=torch.float32, device=self.device)

    # ---- writing --------------------------------------------------------------------------------
    def add(self, obs: Tensor, action: Tensor, step: BatchedStep) -> None:
        """One env step of all N copies: the observations acted on, the actions taken (in [-1, 1], as
        the learner trains on them) and what the env returned."""
        slot = self.cursor
        self.obs[slot] = obs
        self.action[slot] = action
        self.reward[slot] = step.reward
        self.next_obs[slot] = step.next_obs
        self.terminated[slot] = step.terminated
        self.truncated[slot] = step.truncated
        self.valid[slot] = step.valid
        so_far = step.valid.cumsum(0)
        self.rows_so_far[slot] = so_far
        self.slice_rows[slot] = so_far[-1]
        self.cursor = (slot + 1) % self.capacity
        self.slices = min(self.slices + 1, self.capacity)
        self.steps_added += 1
        self._drawable_slices = None

    def cut(self) -> None:
        """End every episode at the newest slice, as a time limit would (its stored next_obs is the
        true next observation, so it is bootstrapped from): what comes next in each column belongs to
        other episodes (a resume whose env could not be restored starts them afresh)."""
        if self.slices:
            newest = (self.cursor - 1) % self.capacity
            self.truncated[newest] |= ~self.terminated[newest]

    # ---- reading --------------------------------------------------------------------------------
    @property
    def size(self) -> Tensor:
        """Rows a sample can draw (valid, their n-step window written), a 0-d int64 tensor on the
        device: read it with the iteration's other numbers, not on its own."""
        return self._drawable()[-1]

    def sample(self, batches: int, batch_size: int, generator: torch.Generator) -> Batch:
        """(batches, batch_size) transitions drawn uniformly, with replacement, from the drawable rows."""
        drawable = self._drawable()
        total = drawable[-1]
        draws = torch.rand(batches * batch_size, generator=generator, device=self.device, dtype=torch.float64)
        # the k-th drawable row (k uniform in [0, total)): its slice is the first whose running count
        # exceeds k, and inside it, the row whose count of valid rows so far first exceeds what is left of k
        rank = (draws * total).long()
        start = torch.searchsorted(drawable, rank, right=True).clamp_(max=self.capacity - 1)
        rank_in_slice = rank - (drawable[start] - self.slice_rows[start])
        env = self._row_in_slice(start, rank_in_slice)
        flat = start * self.num_envs + env
        if self.n_step == 1:
            reward, last = self.reward.view(-1)[flat], flat
            discount = torch.full_like(reward, self.gamma)
        else:
            reward, last, discount = self._n_step(start, env)
        obs_rows, next_rows = self.obs.view(-1, self.obs_dim), self.next_obs.view(-1, self.obs_dim)
        batch = Batch(
            obs=obs_rows.index_select(0, flat),
            action=self.action.view(-1, self.act_dim).index_select(0, flat),
            reward=reward,
            next_obs=next_rows.index_select(0, last),
            terminated=self.terminated.view(-1)[last].float(),
            discount=discount,
        )
        return Batch(*(field.reshape(batches, batch_size, *field.shape[1:]) for field in batch))

    def _row_in_slice(self, start: Tensor, rank: Tensor) -> Tensor:
        """The first env column of slice `start` whose count of valid rows so far exceeds `rank`: a
        binary search of every draw at once, log2(N) gathers."""
        counts = self.rows_so_far.view(-1)
        low, high = torch.zeros_like(rank), torch.full_like(rank, self.num_envs - 1)
        base = start * self.num_envs
        for _ in range(self._search_steps):
            middle = (low + high) // 2
            right = counts[base + middle] <= rank
            low = torch.where(right, middle + 1, low)
            high = torch.where(right, high, middle)
        return low

    def _n_step(self, start: Tensor, env: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(return, flat index of the window's last step, gamma^k) of each drawn row's window."""
        offsets = torch.arange(self.n_step, device=self.device)
        steps = (start.unsqueeze(1) + offsets) % self.capacity  # (rows, n): the window's slices, in time order
        window = steps * self.num_envs + env.unsqueeze(1)
        done = (self.terminated.view(-1)[window] | self.truncated.view(-1)[window])
        reward, length = n_step_windows(self.reward.view(-1)[window], done, self.valid.view(-1)[window], self._powers)
        last = window.gather(1, (length - 1).unsqueeze(1)).squeeze(1)
        return reward, last, torch.pow(self.gamma, length.float())

    def _drawable(self) -> Tensor:
        """Running count of drawable rows over the slices in storage order (cached until the next add)."""
        if self._drawable_slices is None:
            ready = self.slices - (self.n_step - 1)  # the oldest slices whose n-step windows are written
            slice_ready = torch.zeros(self.capacity, dtype=torch.bool, device=self.device)
            if ready > 0:
                oldest = (self.cursor - self.slices) % self.capacity
                slice_ready[(oldest + torch.arange(ready, device=self.device)) % self.capacity] = True
            self._drawable_slices = (self.slice_rows * slice_ready).cumsum(0)
        return self._drawable_slices

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The ring (CPU tensors) and where it stands; `load_state_dict` of it samples the same rows."""
        # copies, also on the CPU: the ring goes on changing after the checkpoint is taken
        state: dict[str, Any] = {name: getattr(self, name).to("cpu", copy=True) for name in _RING_FIELDS}
        state.update(cursor=self.cursor, slices=self.slices, steps_added=self.steps_added,
                     n_step=self.n_step, gamma=self.gamma)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in _RING_FIELDS:
            current, saved = getattr(self, name), state[name]
            if tuple(saved.shape) != tuple(current.shape):
                raise ReplayShapeError(
                    f"the checkpoint's replay ring holds {name} of shape {tuple(saved.shape)} (steps, envs, ...), "
                    f"this run's ring {tuple(current.shape)}: resume with the same runners.envs_per_runner, "
                    "algo.buffer_size and env, or resume without the replay file"
                )
            current.copy_(saved)
        self.rows_so_far.copy_(self.valid.cumsum(1))
        self.slice_rows.copy_(self.rows_so_far[:, -1])
        self.cursor, self.slices, self.steps_added = int(state["cursor"]), int(state["slices"]), \
            int(state["steps_added"])
        self._drawable_slices = None
