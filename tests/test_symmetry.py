"""Symmetry augmentation (`algo.sym_aug`): each registered mirror is an involution and commutes with
its env's dynamics (pusher-reach and Ant-v5, stepped in MuJoCo from a mirrored state with mirrored
actions); pusher-reach's scripted controller acts mirrored on mirrored states; the learner (and only
the learner) doubles each batch with its mirror image; PPO doubles each minibatch and its symmetry
loss makes an asymmetric policy symmetric; envs without a mirror are refused."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.ppo import PPO, symmetry_loss
from aa_ray.envs import scripted_action
from aa_ray.envs.symmetry import MIRRORS, augment, mirror_for, sym_aug_mirror
from aa_ray.errors import SpecError
from aa_ray.records import ObsDims, Rollout, RolloutChunk, Transitions
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.replay import FIELDS
from aa_ray.spec.loader import apply_overrides, load_spec, read_yaml, validate_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"


@pytest.mark.parametrize("env_id", sorted(MIRRORS))
def test_each_mirror_is_an_involution_that_changes_something(env_id: str) -> None:
    mirror = MIRRORS[env_id]
    rng = np.random.default_rng(0)
    obs, action = rng.normal(size=(7, mirror.obs_dim)), rng.normal(size=(7, mirror.act_dim))
    np.testing.assert_array_equal(mirror.obs(mirror.obs(obs)), obs)
    np.testing.assert_array_equal(mirror.action(mirror.action(action)), action)
    assert not np.allclose(mirror.obs(obs), obs) and not np.allclose(mirror.action(action), action)


def mirrored_state(env_id: str, qpos: np.ndarray, qvel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The simulator state's mirror image (y -> -y), written independently of the observation mirror."""
    qpos, qvel = qpos.copy(), qvel.copy()
    if env_id == "aa_ray/PusherReach-v0":
        return -qpos, -qvel
    # Ant: free joint (x, y, z, quaternion w x y z), then hip/ankle 1..4; leg 1 <-> 4, leg 2 <-> 3
    qpos[1], qpos[4], qpos[6] = -qpos[1], -qpos[4], -qpos[6]
    qvel[1], qvel[3], qvel[5] = -qvel[1], -qvel[3], -qvel[5]
    for values, first in ((qpos, 7), (qvel, 6)):
        hips, ankles = values[first::2][:4].copy(), values[first + 1::2][:4].copy()
        values[first::2][:4], values[first + 1::2][:4] = -hips[[3, 2, 1, 0]], ankles[[3, 2, 1, 0]]
    return qpos, qvel


@pytest.mark.parametrize("env_id", ["aa_ray/PusherReach-v0", "Ant-v5"])
def test_the_env_stepped_from_a_mirrored_state_with_mirrored_actions_stays_mirrored(env_id: str) -> None:
    mirror = mirror_for(env_id)
    original, image = gym.make(env_id), gym.make(env_id)
    obs, _ = original.reset(seed=3)
    image.reset(seed=3)
    for _ in range(5):  # away from the symmetric start pose: some contact, some velocity
        obs, *_ = original.step(original.action_space.sample())
    data, target = original.unwrapped.data, image.unwrapped
    target.data.qpos[:], target.data.qvel[:] = mirrored_state(env_id, data.qpos, data.qvel)
    mujoco.mj_forward(target.model, target.data)
    if env_id == "aa_ray/PusherReach-v0":  # its target lives outside the simulator state
        target._target = original.unwrapped._target * np.array([1.0, -1.0])
    rng = np.random.default_rng(1)
    for step in range(20):
        action = rng.uniform(-1, 1, size=mirror.act_dim).astype(np.float32)
        obs, reward, *_ = original.step(action)
        image_obs, image_reward, *_ = image.step(mirror.action(action))
        np.testing.assert_allclose(image_obs, mirror.obs(obs), atol=1e-4, err_msg=f"step {step}")
        if step > 0:  # Ant's first reward differs: MuJoCo's body positions lag a step behind a stepped state
            assert image_reward == pytest.approx(reward, abs=1e-5)


def test_the_scripted_controller_acts_mirrored_on_mirrored_pusher_reach_states() -> None:
    mirror = mirror_for("aa_ray/PusherReach-v0")
    env = gym.make("aa_ray/PusherReach-v0")
    states = []
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        for _ in range(seed % 7):
            obs, *_ = env.step(env.action_space.sample())
        states.append(obs)
    states = np.array(states)
    np.testing.assert_allclose(scripted_action(mirror.obs(states)), mirror.action(scripted_action(states)), atol=1e-5)


def test_the_learner_doubles_each_batch_with_its_mirror_image() -> None:
    mirror = mirror_for("aa_ray/PusherReach-v0")
    rng = np.random.default_rng(2)
    shape = (3, 8)  # (batches, batch)
    columns = {"obs": rng.normal(size=(*shape, 10)), "next_obs": rng.normal(size=(*shape, 10)),
               "action": rng.uniform(-1, 1, size=(*shape, 2))}
    samples = Transitions(**columns, **{name: rng.normal(size=shape) for name in FIELDS if name not in columns})
    doubled = augment(samples, mirror)
    for name, column in zip(FIELDS, samples, strict=True):
        assert getattr(doubled, name).shape[:2] == (3, 16)
        np.testing.assert_array_equal(getattr(doubled, name)[:, :8], column)
        mirrored = mirror.action(column) if name == "action" else mirror.obs(column) if "obs" in name else column
        np.testing.assert_array_equal(getattr(doubled, name)[:, 8:], mirrored)


def test_sym_aug_is_refused_naming_the_env_without_a_mirror() -> None:
    with pytest.raises(SpecError, match="algo.sym_aug needs mirror transforms for env 'Pendulum-v1'"):
        load_spec(SPECS / "sac_pendulum.yaml", ["algo.sym_aug=true"])
    other_obs = ["env.id=Ant-v5", "algo.sym_aug=true", "env.kwargs={include_cfrc_ext_in_observation: false}"]
    with pytest.raises(SpecError, match="mirror of Ant-v5 is for 105 observation"):  # load_spec refuses it first
        load_spec(SPECS / "sac.yaml", other_obs)
    ant = validate_spec(apply_overrides(read_yaml(SPECS / "sac.yaml"), other_obs))  # ... and so does the run
    with pytest.raises(SpecError, match="mirror of Ant-v5 is for 105 observation"):
        sym_aug_mirror(ant, 27, 8)
    assert sym_aug_mirror(load_spec(SPECS / "sac.yaml"), 10, 2) is None


@pytest.fixture(scope="module")
def pusher_rollout() -> RolloutChunk:
    """32 steps of 4 pusher-reach copies under a fresh PPO policy (seeded: a runner's own policy is
    initialized from torch's global generator until the learner's weights arrive)."""
    spec = load_spec(SPECS / "ppo.yaml", ["tracking.enabled=false", "runners.envs_per_runner=4"])
    torch.manual_seed(0)
    return EnvRunner(spec, index=0).sample_rollout(32)[0]


def ppo_with_sym_aug(*overrides: str) -> PPO:
    spec = load_spec(SPECS / "ppo.yaml", ["tracking.enabled=false", "algo.sym_aug=true", *overrides])
    torch.manual_seed(0)
    return PPO(spec.algo, ObsDims.of(10), 2, TrainingSetup.on_cpu(), mirror=mirror_for(spec.env.id))


def test_ppo_doubles_each_minibatch_with_its_mirror_image(pusher_rollout: RolloutChunk) -> None:
    """Every minibatch the actor and critic see is [rows; the rows' mirror images], mirrored before the
    observation normalizer, and the update logs actor/symmetry_loss."""
    algo = ppo_with_sym_aug("algo.ppo_epochs=1")
    mirror, seen = algo.mirror, []
    actor = algo.actor_ddp
    algo.actor_ddp = lambda obs, action: seen.append((obs, action)) or actor(obs, action)
    info = algo.update(Rollout.from_chunk(pusher_rollout, torch.device("cpu")))
    assert len(seen) == algo.cfg.num_minibatches and float(info["actor/symmetry_loss"]) >= 0
    raw = torch.as_tensor(pusher_rollout.obs, dtype=torch.float32).flatten(0, 1)
    normalized, mirrored = algo.policy.obs_norm(raw), algo.policy.obs_norm(mirror.obs(raw))
    for obs, action in seen:
        half = len(obs) // 2
        assert len(obs) == 2 * (32 * 4 // algo.cfg.num_minibatches)
        rows = [int(torch.argmin((normalized - o).abs().sum(-1))) for o in obs[:half]]  # which rollout rows
        torch.testing.assert_close(obs[half:], mirrored[rows])
        torch.testing.assert_close(action[half:], mirror.action(action[:half]))


def test_ppo_with_sym_aug_makes_an_asymmetric_policy_symmetric(pusher_rollout: RolloutChunk) -> None:
    """A policy biased to push both joints one way (the mirror changes both torques' signs) starts with
    a symmetry gap of (0.5 - (-0.5))^2 = 1. Three updates with sym_aug (mirrored minibatches and the
    symmetry loss) make it nearly symmetric; three plain PPO updates on the same rollout do not."""
    data = Rollout.from_chunk(pusher_rollout, torch.device("cpu"))
    raw, mirror = data.obs.flatten(0, 1), mirror_for("aa_ray/PusherReach-v0")
    gaps = {}
    for sym_aug in (False, True):
        algo = ppo_with_sym_aug(f"algo.sym_aug={str(sym_aug).lower()}", "algo.desired_kl=null")
        policy = algo.policy
        with torch.no_grad():
            policy.actor.mean[-1].bias.fill_(0.5)
        for _ in range(3):
            algo.update(data)
        with torch.no_grad():
            mean = policy.actor.mean(policy.obs_norm(raw))
            gaps[sym_aug] = float(symmetry_loss(mean, policy.actor.mean(policy.obs_norm(mirror.obs(raw))), mirror))
    assert gaps[True] < 0.01 and gaps[False] > 4 * gaps[True], gaps  # seed 0: 0.0026 and 0.21


def test_a_ppo_learner_with_sym_aug_logs_the_symmetry_loss(pusher_rollout: RolloutChunk) -> None:
    """The learner gives PPO the env's mirror: its update reports actor/symmetry_loss (plain PPO's does not)."""
    infos = {}
    for sym_aug in ("true", "false"):
        spec = load_spec(SPECS / "ppo.yaml", ["tracking.enabled=false", f"algo.sym_aug={sym_aug}"])
        infos[sym_aug] = Learner(spec, 10, 2).update([], pusher_rollout).metrics
    assert 0 <= infos["true"]["actor/symmetry_loss"] < 1 and "actor/symmetry_loss" not in infos["false"]


def test_ppo_refuses_sym_aug_without_a_mirror() -> None:
    spec = load_spec(SPECS / "ppo.yaml", ["tracking.enabled=false", "algo.sym_aug=true"])
    with pytest.raises(ValueError, match="PPO needs the env's mirror"):
        PPO(spec.algo, ObsDims.of(10), 2, TrainingSetup.on_cpu())
    with pytest.raises(SpecError, match="algo.sym_aug needs mirror transforms for env 'Pendulum-v1'"):
        load_spec(SPECS / "ppo.yaml", ["algo.sym_aug=true", "env.id=Pendulum-v1"])
