"""Grouped observations: an env whose observation space is a Dict of Boxes (proprioception,
commands, privileged state only the critic may see, a goal env's observation / achieved_goal /
desired_goal).

The spec names the keys the actor sees (`algo.actor_obs`) and the keys the critic sees
(`algo.critic_obs`, which includes the actor's). `GroupedObservations`, a gymnasium observation
wrapper put on every env copy, lays the used keys out as one flat vector: the actor's keys first,
in the spec's order, then the critic's others. So the runtime moves, stores and normalizes one
float array per observation as for a flat Box (each feature has its own running statistics, so each
key is normalized on its own), the actor reads the first `ObsDims.actor` features, the critic all
of them, and the stored files (replay, datasets) keep one column per key (`ObsLayout.split`).
A flat Box env needs none of this and works as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from aa_ray.records import ObsDims


class ObsLayoutError(ValueError):
    """The spec's actor_obs / critic_obs do not fit the env's observations; the message names the field."""


@dataclass(frozen=True)
class ObsLayout:
    """Which Dict keys are used and where each sits in the flat vector."""

    groups: tuple[tuple[str, int], ...]  # (key, features) in flat order: the actor's keys, then the critic's others
    actor_keys: tuple[str, ...]

    @property
    def dims(self) -> ObsDims:
        actor = sum(dim for key, dim in self.groups if key in self.actor_keys)
        return ObsDims(actor=actor, full=sum(dim for _, dim in self.groups), groups=self.groups)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.groups)

    def flatten(self, obs: Mapping[str, Any], keys: Sequence[str] | None = None) -> np.ndarray:
        """The flat vector (..., features) of the used keys (or of `keys`, a prefix of the layout)."""
        keys = self.keys if keys is None else keys
        return np.concatenate([np.asarray(obs[key], dtype=np.float32) for key in keys], axis=-1)

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """One array per key out of flat vectors (..., features): what the stored files hold."""
        out, start = {}, 0
        for key, dim in self.groups:
            out[key] = flat[..., start:start + dim]
            start += dim
        return out

    def actor_input(self, obs: Mapping[str, Any]) -> np.ndarray:
        """The actor's flat input from a Dict observation (extra keys, e.g. privileged ones, ignored).
        KeyError naming the missing key."""
        missing = [key for key in self.actor_keys if key not in obs]
        if missing:
            raise KeyError(f"the observation lacks the actor's key(s) {', '.join(missing)} (it reads "
                           f"{', '.join(self.actor_keys)})")
        return self.flatten(obs, self.actor_keys)


# The field's names for an asymmetric actor-critic's two groups: (what the deployed policy reads, what
# only the critic adds). MuJoCo Playground's tasks and EnvPool's ports of them use the first, UniLab's
# the second. A Dict observation holding one such pair is laid out that way when the spec names no keys.
ASYMMETRIC_GROUPS = (("state", "privileged_state"), ("obs", "critic"))


def default_groups(keys: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """(actor keys, critic keys) for a Dict observation whose keys hold one of `ASYMMETRIC_GROUPS`'
    pairs, else None (the actor and the critic then read every key)."""
    for actor, critic_only in ASYMMETRIC_GROUPS:
        if actor in keys and critic_only in keys:
            return [actor], [actor, critic_only]
    return None


def obs_layout(space: gym.Space, actor_obs: Sequence[str] | None, critic_obs: Sequence[str] | None) -> ObsLayout | None:
    """The layout of a Dict observation space for the spec's key lists (None for a flat Box, which
    needs none). Lists left out read every key, or, where the keys hold one of `ASYMMETRIC_GROUPS`'
    pairs, the pair's actor group for the actor and both for the critic. ObsLayoutError naming the
    field for a key the env does not have, a non-Box entry, or a critic that does not see the actor's keys."""
    if not isinstance(space, gym.spaces.Dict):
        if actor_obs is not None or critic_obs is not None:
            raise ObsLayoutError(
                f"algo.actor_obs / algo.critic_obs name observation keys, but this env's observations are a "
                f"{type(space).__name__} of shape {space.shape}, not a Dict: leave both out"
            )
        return None
    available = list(space.spaces)
    pair = default_groups(available)
    if actor_obs is None and critic_obs is None and pair is not None:
        actor_obs, critic_obs = pair
    actor = list(actor_obs) if actor_obs is not None else available
    critic = list(critic_obs) if critic_obs is not None else actor
    for field, keys in (("algo.actor_obs", actor), ("algo.critic_obs", critic)):
        unknown = [key for key in keys if key not in space.spaces]
        if unknown:
            raise ObsLayoutError(f"{field}: the env's observations have no key {unknown[0]!r} (its keys: "
                             f"{', '.join(available)})")
        if len(set(keys)) != len(keys):
            raise ObsLayoutError(f"{field} names a key twice: {keys}")
    missing = [key for key in actor if key not in critic]
    if missing:
        raise ObsLayoutError(f"algo.critic_obs must include every key the actor sees; add {', '.join(missing)}")
    used = actor + [key for key in critic if key not in actor]
    for key in used:
        entry = space.spaces[key]
        if not (isinstance(entry, gym.spaces.Box) and len(entry.shape) == 1):
            raise ObsLayoutError(
                f"observation key {key!r} is {entry}: every key the actor or critic reads must be a flat Box "
                "(flatten it in a wrapper of your env, or leave it out of algo.actor_obs and algo.critic_obs)"
            )
    return ObsLayout(tuple((key, space.spaces[key].shape[0]) for key in used), tuple(actor))


class GroupedObservations(gym.ObservationWrapper):
    """A Dict-observation env seen through its layout: one flat float32 Box, actor keys first."""

    def __init__(self, env: gym.Env, layout: ObsLayout):
        super().__init__(env)
        self.layout = layout
        spaces = [env.observation_space.spaces[key] for key in layout.keys]
        self.observation_space = gym.spaces.Box(
            np.concatenate([s.low for s in spaces]).astype(np.float32),
            np.concatenate([s.high for s in spaces]).astype(np.float32), dtype=np.float32,
        )

    def observation(self, observation: Mapping[str, Any]) -> np.ndarray:
        return self.layout.flatten(observation)
