"""PointReach: a point mass on a plane that must reach a target, N copies stepped in one call with
torch ops only, on any device. It is aa-ray's own batched task, written in the shape Isaac Lab and
mjlab hand a trainer (`num_envs`, `device`, a Dict of observation groups, torch tensors in and out,
the copies that finished reset inside `step`), so the batched path can be tested and measured
without a GPU, JAX or a simulator.

The task, per copy:
- action: a velocity command in [-1, 1]^2 (x `MAX_SPEED`); the velocity follows it with a first-order
  lag (`VELOCITY_KEPT` of it is kept each step), so the task has momentum but stays easy to control;
- the point stays in the square [-1, 1]^2 (a wall stops the velocity across it);
- reward: minus the distance to the target, plus `success_bonus` while within `SUCCESS_RADIUS`;
- episodes end at `max_episode_steps` steps (truncation), or on success when `terminate_on_success`.

Observation groups (one copy's, `observation_space`):
- `policy`, what the actor sees: position (2), velocity (2), target minus position (2);
- `critic`, privileged extras: the target itself (2) and the previous action (2).
The spec maps them with `algo.actor_obs: [policy]`, `algo.critic_obs: [policy, critic]`.

`step` returns `(obs, reward, terminated, truncated, extras)`; a copy whose episode ended this step
is already reset in `obs`, and `extras` holds what the step was before those resets:
- `extras["final_obs"]`: the observation groups before the resets (all N rows; where no episode
  ended they equal `obs`);
- `extras["final_info"]`: `distance` (to the target) and `is_success`, (N,) each, at this step
  before the resets; read them at the rows that are done for an episode's final values.

Every random draw comes from the task's own `torch.Generator` (seeded by `reset(seed)`), and each
step draws the reset values of every copy whether or not it ended (then keeps those of the copies
that did): the stream does not depend on which episodes ended, and nothing waits on the device to
find out. `state_dict()` / `load_state_dict()` capture everything, so a resumed run repeats the
uninterrupted one bit for bit.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

DT = 0.05  # seconds per step
MAX_SPEED = 2.0  # units per second at |action| = 1: 0.1 of the 2-unit arena per step
VELOCITY_KEPT = 0.8  # per step: a time constant of about 0.22 s, momentum without overshoot to fight
ARENA = 1.0  # the point stays in [-ARENA, ARENA]^2
TARGET_RANGE = 0.8  # targets lie in [-TARGET_RANGE, TARGET_RANGE]^2, away from the walls
SUCCESS_RADIUS = 0.05
SUCCESS_BONUS = 1.0
MAX_EPISODE_STEPS = 100  # 5 s: the farthest target is about 28 steps away at full speed

POLICY_DIM = 6
CRITIC_DIM = 4
ACT_DIM = 2

# the columns of PointReach.state
POSITION, TARGET, VELOCITY, LAST_ACTION = slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)
# what a checkpoint of the task holds, besides the generator's state
_STATE_TENSORS = ("state", "steps")


class PointReach:
    """`num_envs` copies of the reaching task on `device` (see the module docstring).

    `max_episode_steps`: steps before a time limit truncates an episode; `terminate_on_success`: end an
    episode (terminated) as soon as the point is within `SUCCESS_RADIUS`; `success_bonus`: reward
    added at every step spent within it."""

    metadata: dict[str, Any] = {"info_metrics": ["distance"]}

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", max_episode_steps: int = MAX_EPISODE_STEPS,
                 terminate_on_success: bool = False, success_bonus: float = SUCCESS_BONUS):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"PointReach: num_envs must be a positive integer, got {num_envs!r}")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(
                f"PointReach: max_episode_steps (env.kwargs) must be a positive integer, got {max_episode_steps!r}"
            )
        if not np.isfinite(success_bonus):
            raise ValueError(f"PointReach: success_bonus (env.kwargs) must be a finite number, got {success_bonus!r}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_episode_steps = max_episode_steps
        self.terminate_on_success = bool(terminate_on_success)
        self.success_bonus = float(success_bonus)

        position_box = gym.spaces.Box(-ARENA, ARENA, (2,), np.float32)
        speed_box = gym.spaces.Box(-MAX_SPEED, MAX_SPEED, (2,), np.float32)
        offset_box = gym.spaces.Box(-2 * ARENA, 2 * ARENA, (2,), np.float32)
        policy = gym.spaces.Box(
            np.concatenate([position_box.low, speed_box.low, offset_box.low]),
            np.concatenate([position_box.high, speed_box.high, offset_box.high]), dtype=np.float32,
        )
        critic = gym.spaces.Box(np.array([-TARGET_RANGE] * 2 + [-1.0] * 2, np.float32),
                                np.array([TARGET_RANGE] * 2 + [1.0] * 2, np.float32), dtype=np.float32)
        self.observation_space = gym.spaces.Dict({"policy": policy, "critic": critic})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)

        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(0)  # reset(seed) reseeds; without a seed the task is still deterministic
        # every copy's state in one (N, 8) tensor, so a reset is one `where`: columns POSITION, TARGET,
        # VELOCITY, LAST_ACTION. Each step makes a new one: nothing handed out is written again.
        self.state = torch.zeros((num_envs, 8), device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._no_termination = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        # a start is uniform in [-ARENA, ARENA]^2 (position) and [-TARGET_RANGE, TARGET_RANGE]^2 (target)
        self._start_scale = torch.tensor([2 * ARENA] * 2 + [2 * TARGET_RANGE] * 2, device=self.device)
        self._start_offset = torch.tensor([-ARENA] * 2 + [-TARGET_RANGE] * 2, device=self.device)

    def reset(self, seed: int | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Start a new episode in every copy (from `seed`'s stream when given); (obs groups, extras)."""
        if seed is not None:
            self.generator.manual_seed(seed)
        self.state = self._draw_starts()
        self.steps = torch.zeros_like(self.steps)
        return self._observe(), {}

    @torch.no_grad()
    def step(self, actions: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor, dict[str, Any]]:
        """Apply (N, 2) actions to every copy; the copies whose episode ended are reset before this
        returns (their last observation and info are in `extras`, see the module docstring)."""
        actions = actions.to(device=self.device, dtype=torch.float32).clamp(-1.0, 1.0)
        position, target, velocity = self.state[:, POSITION], self.state[:, TARGET], self.state[:, VELOCITY]
        velocity = VELOCITY_KEPT * velocity + ((1.0 - VELOCITY_KEPT) * MAX_SPEED) * actions
        moved = position + DT * velocity
        position = moved.clamp(-ARENA, ARENA)
        velocity = velocity * (position == moved)  # a wall stops the motion across it
        self.state = torch.cat([position, target, velocity, actions], dim=-1)
        self.steps = self.steps + 1

        distance = torch.linalg.vector_norm(target - position, dim=-1)
        success = distance < SUCCESS_RADIUS
        reward = self.success_bonus * success - distance
        terminated = success if self.terminate_on_success else self._no_termination
        # a copy that both succeeds and runs out of time at this step ends terminated, as a
        # gymnasium TimeLimit reports it: the bootstrap is cut either way
        truncated = (self.steps >= self.max_episode_steps) & ~terminated
        done = terminated | truncated

        final_obs = self._observe()
        extras = {"final_obs": final_obs, "final_info": {"distance": distance, "is_success": success}}
        # every copy's start is drawn and kept where done: no host read of `done`, and a random stream
        # that does not depend on which episodes ended
        self.state = torch.where(done.unsqueeze(-1), self._draw_starts(), self.state)
        self.steps = torch.where(done, 0, self.steps)
        return self._observe(), reward, terminated, truncated, extras

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on: the copies' state and the generator's."""
        state: dict[str, Any] = {name: getattr(self, name).clone() for name in _STATE_TENSORS}
        state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()`'s output. ValueError when it is another size of task."""
        for name in _STATE_TENSORS:
            value = state[name]
            current = getattr(self, name)
            if value.shape != current.shape:
                raise ValueError(
                    f"PointReach state: {name} has shape {tuple(value.shape)}, this task {tuple(current.shape)} "
                    f"({self.num_envs} envs); resume with the same number of envs"
                )
            setattr(self, name, value.to(device=self.device, dtype=current.dtype).clone())
        self.generator.set_state(state["generator"])

    def close(self) -> None:
        """Nothing to release: the task is tensors only."""

    def _draw_starts(self) -> Tensor:
        """A fresh state for every copy (random position and target, at rest), one draw from the generator."""
        uniform = torch.rand((self.num_envs, 4), generator=self.generator, device=self.device)
        return torch.nn.functional.pad(uniform * self._start_scale + self._start_offset, (0, 4))

    def _observe(self) -> dict[str, Tensor]:
        state = self.state
        # one new tensor whose column ranges are the groups (views): policy = position, velocity,
        # target - position; critic = target, last action
        full = torch.cat([state[:, POSITION], state[:, VELOCITY], state[:, TARGET] - state[:, POSITION],
                          state[:, TARGET], state[:, LAST_ACTION]], dim=-1)
        return {"policy": full[:, :POLICY_DIM], "critic": full[:, POLICY_DIM:]}
