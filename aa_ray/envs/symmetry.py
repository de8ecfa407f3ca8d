"""Mirror symmetries of envs, for symmetry augmentation (`algo.sym_aug`).

A `Mirror` maps an observation and an action of an env to those of its mirror image: feature `i`
of the mirrored vector is `sign[i] * x[perm[i]]`, which covers reflections (a sign) and swapped
left/right parts (a permutation). Every mirror is an involution (mirroring twice is the identity),
and the env's dynamics commute with it: the mirror of a state, driven by mirrored actions, stays the
mirror of the original (tests check both, Ant's in MuJoCo itself).

A user's env brings its own: `env.mirror: mypkg.envs:MIRROR` names one by import path, or the env
class declares it as `metadata["mirror"]`. Either may be a `Mirror`, a mapping with the four fields
(`obs_perm`, `obs_sign`, `act_perm`, `act_sign`), or a function of no arguments returning one; it is
checked to be an involution before training starts (`find_mirror`).

aa-ray's own, per env id:
- pusher-reach: the planar arm mirrored across its base's x axis (y -> -y): joint angles and
  velocities and torques change sign, target and fingertip offsets flip their y.
- Ant-v5 (default observation: no x/y, contact forces included): mirrored left-right (y -> -y):
  the left front leg swaps with the right front leg (hip_1 <-> hip_4 in MuJoCo's names) and the
  left back leg with the right back leg (hip_2 <-> hip_3); hips turn the other way (angles negated),
  ankles keep their sign (their axes mirror onto each other's); the torso's quaternion (w, x, y, z)
  becomes (w, -x, y, -z), its linear velocity (vx, -vy, vz), its angular velocity (-wx, wy, -wz);
  each body's contact wrench (torque, force) becomes (-tx, ty, -tz, fx, -fy, fz), bodies swapped
  as their legs are.
- UniLab's Go2JoystickFlat (its default layout: `obs`, then `critic`): left and right legs swapped
  (FL <-> FR, RL <-> RR) with the hips turning the other way, in the joints, their velocities and the
  last actions; angular velocities (-wx, wy, -wz), gravity and linear velocity (x, -y, z), the command
  (vx, -vy, -wz), the feet's gait phases swapped as their legs are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from aa_ray.envs.source import OWN_TASK_SOURCES, import_object, prepare, registered_id, resolve_entry_point
from aa_ray.errors import SpecError, what_user_code_did
from aa_ray.records import ObsDims, Transitions

Array = TypeVar("Array")  # numpy arrays or torch tensors: indexing and a multiply work on both


@dataclass(frozen=True)
class Mirror:
    obs_perm: tuple[int, ...]
    obs_sign: tuple[float, ...]
    act_perm: tuple[int, ...]
    act_sign: tuple[float, ...]

    def __post_init__(self) -> None:
        for name, perm, sign in (("obs", self.obs_perm, self.obs_sign), ("act", self.act_perm, self.act_sign)):
            if sorted(perm) != list(range(len(perm))) or len(sign) != len(perm):
                raise ValueError(f"{name}_perm must be a permutation of 0..{len(perm) - 1} with one sign each")
            if any(abs(s) != 1.0 for s in sign):
                raise ValueError(f"{name}_sign must hold only 1 and -1, got {list(sign)}")
            # mirroring twice must give the input back: feature i reads perm[i], which reads i, with signs cancelling
            broken = [i for i in range(len(perm)) if perm[perm[i]] != i or sign[i] * sign[perm[i]] != 1.0]
            if broken:
                raise ValueError(
                    f"it is not an involution (mirroring twice must give the input back): {name} feature {broken[0]} "
                    f"maps to {perm[broken[0]]}, which maps to {perm[perm[broken[0]]]} (signs "
                    f"{sign[broken[0]]:g}, {sign[perm[broken[0]]]:g})"
                )

    @property
    def obs_dim(self) -> int:
        return len(self.obs_perm)

    @property
    def act_dim(self) -> int:
        return len(self.act_perm)

    def obs(self, x: Array) -> Array:
        """Mirror observations along the last axis."""
        return _apply(x, self.obs_perm, self.obs_sign)

    def action(self, a: Array) -> Array:
        return _apply(a, self.act_perm, self.act_sign)


def _apply(x: Array, perm: tuple[int, ...], sign: tuple[float, ...]) -> Array:
    if isinstance(x, np.ndarray):
        return x[..., list(perm)] * np.asarray(sign, dtype=x.dtype)
    import torch

    index = torch.as_tensor(perm, device=x.device)
    return x.index_select(-1, index) * torch.as_tensor(sign, dtype=x.dtype, device=x.device)


def _from_pairs(dim: int, swaps: list[tuple[int, int, float]], signs: dict[int, float]) -> tuple[tuple, tuple]:
    """perm/sign of a mirror: `swaps` (i, j, sign) exchange features i and j with that sign; `signs`
    negates features in place; every other feature stays."""
    perm, sign = list(range(dim)), [1.0] * dim
    for i, j, s in swaps:
        perm[i], perm[j], sign[i], sign[j] = j, i, s, s
    for i, s in signs.items():
        sign[i] = s
    return tuple(perm), tuple(sign)


def _pusher_reach() -> Mirror:
    # [cos q (2), sin q (2), qvel (2), target xy (2), tip - target xy (2)]; actions: two joint torques
    obs_perm, obs_sign = _from_pairs(10, [], {2: -1.0, 3: -1.0, 4: -1.0, 5: -1.0, 7: -1.0, 9: -1.0})
    return Mirror(obs_perm, obs_sign, (0, 1), (-1.0, -1.0))


# Ant-v5's joints in qpos order, and which joint each actuator drives (MuJoCo's ant.xml)
_ANT_JOINTS = ("hip_1", "ankle_1", "hip_2", "ankle_2", "hip_3", "ankle_3", "hip_4", "ankle_4")
_ANT_ACTUATORS = ("hip_4", "ankle_4", "hip_1", "ankle_1", "hip_2", "ankle_2", "hip_3", "ankle_3")
_ANT_LEGS = {"1": "4", "4": "1", "2": "3", "3": "2"}  # left <-> right (y -> -y)
# the 13 bodies whose contact wrenches the observation holds, by index into cfrc_ext[1:]:
# torso, then each leg's 3 bodies (leg, aux, foot) for legs 1..4
_ANT_BODY_MIRROR = {0: 0, **{1 + 3 * leg + part: 1 + 3 * (3 - leg) + part for leg in range(4) for part in range(3)}}


def _ant() -> Mirror:
    def joint_mirror(names: tuple[str, ...], offset: int) -> list[tuple[int, int, float]]:
        out = []
        for i, name in enumerate(names):
            kind, leg = name.split("_")
            j = names.index(f"{kind}_{_ANT_LEGS[leg]}")
            if i < j:
                out.append((offset + i, offset + j, -1.0 if kind == "hip" else 1.0))
        return out

    # obs: z, quat (w x y z), 8 joint angles | vx vy vz, wx wy wz, 8 joint velocities | 13 x (torque, force)
    swaps = joint_mirror(_ANT_JOINTS, 5) + joint_mirror(_ANT_JOINTS, 19)
    signs = {2: -1.0, 4: -1.0, 14: -1.0, 16: -1.0, 18: -1.0}  # quat x, z; vy; wx, wz
    wrench_sign = (-1.0, 1.0, -1.0, 1.0, -1.0, 1.0)
    perm, sign = _from_pairs(105, swaps, signs)
    perm, sign = list(perm), list(sign)
    for body, image in _ANT_BODY_MIRROR.items():
        for k in range(6):
            perm[27 + 6 * body + k] = 27 + 6 * image + k
            sign[27 + 6 * body + k] = wrench_sign[k]
    act_swaps = joint_mirror(_ANT_ACTUATORS, 0)
    act_perm, act_sign = _from_pairs(8, act_swaps, {})
    return Mirror(tuple(perm), tuple(sign), act_perm, act_sign)


def _quadruped_legs(offset: int) -> list[tuple[int, int, float]]:
    """Swaps of 12 features laid out as 4 legs x (hip, thigh, calf) whose leg slots pair left with right
    as (0, 1) and (2, 3): FL, FR, RL, RR (Go2's joints) and FR, FL, RR, RL (its actuators) both do. The
    hips' axes point forward, so a mirrored hip turns the other way; thighs and calves pitch about the
    lateral axis, which the mirror keeps."""
    return [(offset + 3 * left + part, offset + 3 * right + part, -1.0 if part == 0 else 1.0)
            for left, right in ((0, 1), (2, 3)) for part in range(3)]


def _go2() -> Mirror:
    # UniLab's Go2JoystickFlat (aa_ray/envs/unilab.py), actor group `obs` (49) then `critic` (52), which
    # repeats `obs` and adds the base's linear velocity: gyro (wx, wy, wz), projected gravity, 12 joint
    # positions and 12 velocities (FL, FR, RL, RR), the 12 last actions (FR, FL, RR, RL), the command
    # (vx, vy, wz), each foot's gait phase (FL, FR, RL, RR: a diagonal trot, so the swapped phases are
    # the mirror's at another time of the gait clock) | the same 49 | (vx, vy, vz)
    swaps, signs = [], {}
    for start in (0, 49):
        swaps += _quadruped_legs(start + 6) + _quadruped_legs(start + 18) + _quadruped_legs(start + 30)
        swaps += [(start + 45, start + 46, 1.0), (start + 47, start + 48, 1.0)]
        signs |= {start: -1.0, start + 2: -1.0, start + 4: -1.0, start + 43: -1.0, start + 44: -1.0}
    signs[99] = -1.0
    obs_perm, obs_sign = _from_pairs(101, swaps, signs)
    act_perm, act_sign = _from_pairs(12, _quadruped_legs(0), {})
    return Mirror(obs_perm, obs_sign, act_perm, act_sign)


MIRRORS: dict[str, Mirror] = {"aa_ray/PusherReach-v0": _pusher_reach(), "Ant-v5": _ant(), "Go2JoystickFlat": _go2()}


def mirror_for(env_id: str) -> Mirror | None:
    """aa-ray's own mirror of an env id (`module:EnvId` included), or None."""
    return MIRRORS.get(registered_id(env_id))


def find_mirror(env: Any) -> Mirror | None:
    """The mirror of the spec's env (its `env` section): `env.mirror`, else aa-ray's own for its id,
    else the one its env class declares in `metadata["mirror"]`; None when it has none. ValueError,
    naming where the mirror came from, when it is not a valid mirror (not an involution, ...)."""
    if env.mirror is not None:
        prepare(env)  # a learner's process imports the user's modules here
        return as_mirror(import_object(env.mirror, "env.mirror", env, "MIRROR (e.g. mypkg.envs:MIRROR)"),
                         f"env.mirror {env.mirror}")
    if env.entry_point is None and (own := mirror_for(env.id)) is not None:
        return own
    if env.entry_point is None and getattr(env, "batched", None) in OWN_TASK_SOURCES:
        return None  # a task of EnvPool's, Playground's or UniLab's, by id: no env class of ours to declare one
    declared = (getattr(env_class(env), "metadata", None) or {}).get("mirror")
    return None if declared is None else as_mirror(declared, f"the metadata['mirror'] of env {env.id}")


def env_class(env: Any) -> Any:
    """The spec's env class (or creator), without making an env."""
    prepare(env)
    if env.entry_point is not None:
        return resolve_entry_point(env.entry_point, env)
    entry = gym.spec(registered_id(env.id)).entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def as_mirror(declared: Any, where: str) -> Mirror:
    """A `Mirror` from what a user declared: a Mirror, a mapping of its four fields, or a function
    returning either."""
    if callable(declared) and not isinstance(declared, Mirror):
        try:
            declared = declared()
        except (Exception, SystemExit) as err:  # the user's function: whatever it raises is for them to fix
            raise ValueError(f"{where}: calling it {what_user_code_did(err)}") from None
    fields = ("obs_perm", "obs_sign", "act_perm", "act_sign")
    if isinstance(declared, Mapping) and set(declared) == set(fields):
        values = dict(declared)
    elif all(hasattr(declared, key) for key in fields):
        values = {key: getattr(declared, key) for key in fields}
    else:
        raise ValueError(f"{where} is not a mirror: give the four sequences {', '.join(fields)}")
    try:
        return Mirror(**{key: tuple(int(i) for i in value) if key.endswith("perm") else tuple(float(s) for s in value)
                         for key, value in values.items()})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def sym_aug_mirror(spec: Any, obs: ObsDims | int, act_dim: int) -> Mirror | None:
    """The mirror a run augments with (None without `algo.sym_aug`); SpecError when the env's
    observations or actions are not the shape its mirror was written for (other env kwargs), or
    are grouped (a mirror maps one flat observation)."""
    if not spec.algo.sym_aug:
        return None
    obs = ObsDims.of(obs)
    if obs.groups:
        raise SpecError(
            f"algo.sym_aug: env {spec.env.id} has Dict observations ({', '.join(k for k, _ in obs.groups)}), and a "
            "mirror maps one flat observation; set algo.sym_aug: false"
        )
    obs_dim = obs.full
    mirror = find_mirror(spec.env)  # the spec's validation refused envs without one
    if (mirror.obs_dim, mirror.act_dim) != (obs_dim, act_dim):
        raise SpecError(
            f"algo.sym_aug: the mirror of {spec.env.id} is for {mirror.obs_dim} observation and {mirror.act_dim} "
            f"action features, but this env (env.kwargs {dict(spec.env.kwargs)}) has {obs_dim} and {act_dim}; "
            "use the env's default observation or set algo.sym_aug: false"
        )
    return mirror


def augment(transitions: Transitions, mirror: Mirror) -> Transitions:
    """Replay batches (..., batch, features) doubled along the batch axis with their mirror images:
    obs, action and next_obs mirrored, reward, done flags and discount as they were."""
    mirrored = transitions._replace(
        obs=mirror.obs(transitions.obs), action=mirror.action(transitions.action),
        next_obs=mirror.obs(transitions.next_obs),
    )
    return Transitions.concat([transitions, mirrored], axis=1)
