"""Pusher-reach: a planar two-link arm that has to put its fingertip on a random target.

The env talks to MuJoCo through the official python bindings directly (no
``MujocoEnv`` base class), so it has no GL dependency unless ``render()`` is called.

Dynamics are deliberately simple and well-conditioned so that an off-policy agent
learns it quickly (stable-baselines3 SAC with default settings gets the mean final
distance below 0.05 m after ~12k env steps and to ~0.03-0.04 m at 20k):

* Large rotor inertia (``armature``) dominates the tiny link inertias, so the two
  joints are nearly decoupled and their response barely depends on the arm's
  configuration.
* Viscous joint damping gives a bounded top speed (``GEAR / DAMPING`` rad/s) and a
  short velocity time constant (``ARMATURE / DAMPING`` s), so a constant action maps
  to a predictable joint velocity.
* A 0.05 s control step and 50-step episodes (2.5 s) give an agent ~10 decisions
  per large move and plenty of time to settle; the scripted controller reaches the
  target in well under half an episode.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

# Geometry. The fingertip site sits exactly at the end of link 2 so the analytic
# kinematics used by ``scripted_action`` match the simulated ones.
LINK1_LENGTH = 0.10
LINK2_LENGTH = 0.11
LINK_RADIUS = 0.01

# Actuation / passive dynamics (see module docstring for why these values).
GEAR = 5.0  # N*m of joint torque at |action| == 1
DAMPING = 0.5  # N*m*s/rad
ARMATURE = 0.05  # kg*m^2 of reflected rotor inertia per joint
ELBOW_RANGE = 3.0  # rad; keeps link 2 from folding through link 1

# Timing.
PHYSICS_TIMESTEP = 0.01
FRAME_SKIP = 5
DT = PHYSICS_TIMESTEP * FRAME_SKIP  # control timestep, 0.05 s
MAX_EPISODE_STEPS = 50  # 2.5 s of simulated time

# Task.
TARGET_RADIUS_RANGE = (0.05, 0.20)  # inside the annulus reachable by |L1-L2|..L1+L2
INIT_QPOS = np.array([0.0, 0.0])  # arm stretched out along +x
INIT_QPOS_NOISE = 0.1  # rad, uniform half-width
INIT_QVEL_NOISE = 0.1  # rad/s, uniform half-width
SUCCESS_DISTANCE = 0.05  # m

# Observation layout: [cos q (2), sin q (2), qvel (2), target xy (2), tip - target xy (2)].
OBS_DIM = 10
# Damping caps joint speed near GEAR / DAMPING (10 rad/s; ~10.1 seen under bang-bang
# actions because of link coupling). Clipping at twice that never bites in practice
# but makes the declared finite observation bounds hold by construction.
QVEL_OBS_LIMIT = 2.0 * GEAR / DAMPING
ACT_DIM = 2

# PD gains of the scripted controller, in action units (torque / GEAR). With the
# armature-dominated joint model I*q'' + b*q' = GEAR*a these place the closed-loop
# poles at wn = sqrt(GEAR*KP/ARMATURE) = 10 rad/s, critically damped
# ((DAMPING + GEAR*KD) = 2*wn*ARMATURE); wn*DT = 0.5 keeps the sampled loop well-behaved.
SCRIPTED_KP = 1.0
SCRIPTED_KD = 0.1

ENV_ID = "aa_ray/PusherReach-v0"

PUSHER_REACH_XML = f"""
<mujoco model="pusher_reach">
  <compiler angle="radian" autolimits="true"/>
  <!-- The arm moves in the horizontal plane: gravity is along the hinge axes and
       would exert no torque, so it is switched off rather than simulated. -->
  <option timestep="{PHYSICS_TIMESTEP}" integrator="implicitfast" gravity="0 0 0"/>
  <visual>
    <global offwidth="640" offheight="640"/>
    <headlight ambient="0.3 0.3 0.3" diffuse="0.3 0.3 0.3" specular="0 0 0"/>
  </visual>
  <default>
    <joint type="hinge" axis="0 0 1" damping="{DAMPING}" armature="{ARMATURE}"/>
    <!-- Nothing collides: the links may pass over each other and over the target. -->
    <geom contype="0" conaffinity="0" density="1000"/>
    <motor ctrlrange="-1 1" gear="{GEAR}"/>
  </default>
  <worldbody>
    <light pos="0 0 1" dir="0 0 -1" directional="true" diffuse="0.5 0.5 0.5"/>
    <camera name="top" pos="0 0 0.55"/>
    <geom name="table" type="plane" pos="0 0 -0.02" size="0.3 0.3 0.01" rgba="0.55 0.55 0.5 1"/>
    <geom name="base" type="cylinder" pos="0 0 -0.01" size="0.02 0.01" rgba="0.3 0.3 0.3 1"/>
    <body name="link1">
      <joint name="shoulder"/>
      <geom name="link1" type="capsule" fromto="0 0 0 {LINK1_LENGTH} 0 0"
            size="{LINK_RADIUS}" rgba="0.2 0.45 0.8 1"/>
      <body name="link2" pos="{LINK1_LENGTH} 0 0">
        <joint name="elbow" range="{-ELBOW_RANGE} {ELBOW_RANGE}"/>
        <geom name="link2" type="capsule" fromto="0 0 0 {LINK2_LENGTH} 0 0"
              size="{LINK_RADIUS}" rgba="0.2 0.7 0.5 1"/>
        <site name="fingertip" pos="{LINK2_LENGTH} 0 0" size="0.012" rgba="0.1 0.1 0.1 1"/>
      </body>
    </body>
    <!-- Mocap body: positioned by the env, has no degrees of freedom. -->
    <body name="target" mocap="true" pos="0.1 0 0">
      <geom name="target" type="sphere" size="0.01" rgba="0.9 0.2 0.2 1"/>
    </body>
  </worldbody>
  <actuator>
    <motor name="shoulder" joint="shoulder"/>
    <motor name="elbow" joint="elbow"/>
  </actuator>
</mujoco>
"""


# obs_groups=True: the flat observation's features by group
OBS_GROUPS = {"proprio": slice(0, 6), "command": slice(6, 8), "privileged": slice(8, 10)}


class PusherReachEnv(gym.Env[np.ndarray, np.ndarray]):
    """Planar two-link reacher; reward is minus the fingertip-target distance each step.

    Never terminates; the time limit (``MAX_EPISODE_STEPS``) is added by the gymnasium
    registration, so the raw class runs forever. ``width``/``height`` of rendered
    frames must not exceed the model's 640x640 offscreen buffer.

    ``obs_groups=True`` returns the same features as a Dict, grouped as a robot's observations
    are: ``proprio`` (joint cos, sin, velocities), ``command`` (the target) and ``privileged`` (the
    fingertip's offset from the target, which a deployed policy would not measure: it must infer
    it from its joints and the command; an asymmetric critic may read it).
    """

    # info_metrics: the task metrics aa-ray records at each episode's end (eval/distance, train/distance;
    # aa_ray.envs.info_metrics); info["is_success"] (within SUCCESS_DISTANCE) gives eval/success.
    # scripted_controller: what `aa-ray rollout --scripted` acts with (aa_ray.envs.controllers), by
    # import path since the function is defined below the class
    metadata = {
        "render_modes": ["rgb_array"],
        "render_fps": int(round(1.0 / DT)),
        "info_metrics": ["distance"],
        "scripted_controller": "aa_ray.envs.pusher_reach:scripted_action",
    }

    def __init__(
        self, render_mode: str | None = None, width: int = 480, height: int = 480, obs_groups: bool = False
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unsupported render_mode {render_mode!r}")
        self.render_mode = render_mode
        self._width = width
        self._height = height

        self.model = mujoco.MjModel.from_xml_string(PUSHER_REACH_XML)
        self.data = mujoco.MjData(self.model)
        self._tip_site = self.model.site("fingertip").id
        self._target_mocap = self.model.body("target").mocapid[0]
        # Created on the first render() call so that training never needs a GL context.
        self._renderer: mujoco.Renderer | None = None

        self._target = np.zeros(2)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(ACT_DIM,), dtype=np.float32)
        reach = LINK1_LENGTH + LINK2_LENGTH
        target_max = TARGET_RADIUS_RANGE[1]
        high = np.array(
            [1.0] * 4 + [QVEL_OBS_LIMIT] * 2 + [target_max] * 2 + [reach + target_max] * 2,
            dtype=np.float32,
        )
        self.obs_groups = obs_groups
        if obs_groups:
            self.observation_space = spaces.Dict({
                name: spaces.Box(-high[part], high[part], dtype=np.float32) for name, part in OBS_GROUPS.items()
            })
        else:
            self.observation_space = spaces.Box(-high, high, dtype=np.float32)

    # ------------------------------------------------------------------ gym API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random

        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:] = INIT_QPOS + rng.uniform(-INIT_QPOS_NOISE, INIT_QPOS_NOISE, size=2)
        self.data.qvel[:] = rng.uniform(-INIT_QVEL_NOISE, INIT_QVEL_NOISE, size=2)

        radius = rng.uniform(*TARGET_RADIUS_RANGE)
        angle = rng.uniform(-np.pi, np.pi)
        self._target = radius * np.array([np.cos(angle), np.sin(angle)])
        self.data.mocap_pos[self._target_mocap, :2] = self._target

        mujoco.mj_forward(self.model, self.data)
        return self._obs(), self._info()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.data.ctrl[:] = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        mujoco.mj_step(self.model, self.data, nstep=FRAME_SKIP)
        # mj_step evaluates kinematics *before* integrating, so site positions would be
        # one physics step stale; refresh them so obs/reward describe the new state.
        mujoco.mj_kinematics(self.model, self.data)

        info = self._info()
        return self._obs(), -info["distance"], False, False, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, height=self._height, width=self._width)
        # Rendering reads derived quantities (camera, light poses) that step() skips;
        # mj_forward only recomputes them from the state, so it cannot change the rollout.
        mujoco.mj_forward(self.model, self.data)
        self._renderer.update_scene(self.data, camera="top")
        return self._renderer.render()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ------------------------------------------------------------------ helpers

    def _fingertip(self) -> np.ndarray:
        return self.data.site_xpos[self._tip_site, :2].copy()

    def _distance(self) -> float:
        return float(np.linalg.norm(self._fingertip() - self._target))

    def _obs(self) -> np.ndarray | dict[str, np.ndarray]:
        flat = self._flat_obs()
        return {name: flat[part] for name, part in OBS_GROUPS.items()} if self.obs_groups else flat

    def _flat_obs(self) -> np.ndarray:
        qpos = self.data.qpos
        return np.concatenate(
            [
                np.cos(qpos),
                np.sin(qpos),
                np.clip(self.data.qvel, -QVEL_OBS_LIMIT, QVEL_OBS_LIMIT),
                self._target,
                self._fingertip() - self._target,
            ]
        ).astype(np.float32)

    def _info(self) -> dict[str, Any]:
        distance = self._distance()
        return {"distance": distance, "is_success": bool(distance < SUCCESS_DISTANCE)}


# ---------------------------------------------------------------------- scripted policy


def _wrap(angle: np.ndarray) -> np.ndarray:
    return (angle + np.pi) % (2.0 * np.pi) - np.pi


def scripted_action(obs: np.ndarray) -> np.ndarray:
    """Expert action from observations alone: analytic IK to the target, then joint PD.

    Accepts a single observation ``(OBS_DIM,)`` or a batch ``(N, OBS_DIM)`` and returns
    actions of shape ``(ACT_DIM,)`` / ``(N, ACT_DIM)`` in [-1, 1].
    """
    obs = np.asarray(obs, dtype=np.float64)
    single = obs.ndim == 1
    obs = np.atleast_2d(obs)
    if obs.shape[-1] != OBS_DIM:
        raise ValueError(f"expected observations with {OBS_DIM} features, got {obs.shape}")

    q = np.arctan2(obs[:, 2:4], obs[:, 0:2])  # (N, 2) current joint angles
    qvel = obs[:, 4:6]
    tx, ty = obs[:, 6], obs[:, 7]

    # Law of cosines for the elbow; clipping guards targets at the edge of the workspace
    # against rounding pushing |cos| just past 1.
    r2 = tx**2 + ty**2
    cos_elbow = (r2 - LINK1_LENGTH**2 - LINK2_LENGTH**2) / (2.0 * LINK1_LENGTH * LINK2_LENGTH)
    elbow = np.arccos(np.clip(cos_elbow, -1.0, 1.0))

    # Both elbow-up and elbow-down solutions; take the one needing the smaller joint
    # motion so the arm does not swing through a far-away configuration. The elbow is
    # joint-limited to (-pi, pi), so its angle error is measured without wrapping; the
    # shoulder turns freely, so its error is wrapped.
    best_err = None
    best_cost = None
    for sign in (1.0, -1.0):
        q2 = sign * elbow
        q1 = np.arctan2(ty, tx) - np.arctan2(LINK2_LENGTH * np.sin(q2), LINK1_LENGTH + LINK2_LENGTH * np.cos(q2))
        err = np.stack([_wrap(q1 - q[:, 0]), q2 - q[:, 1]], axis=-1)
        cost = np.abs(err).sum(axis=-1)
        if best_err is None:
            best_err, best_cost = err, cost
        else:
            better = cost < best_cost
            best_err = np.where(better[:, None], err, best_err)
            best_cost = np.where(better, cost, best_cost)

    action = np.clip(SCRIPTED_KP * best_err - SCRIPTED_KD * qvel, -1.0, 1.0).astype(np.float32)
    return action[0] if single else action


def register_envs() -> None:
    """Register all envs of this package; safe to call any number of times."""
    # gymnasium warns when an id is registered twice (e.g. after importlib.reload),
    # so skip ids that are already known.
    if ENV_ID not in gym.registry:
        gym.register(
            id=ENV_ID,
            entry_point="aa_ray.envs.pusher_reach:PusherReachEnv",
            max_episode_steps=MAX_EPISODE_STEPS,
        )
