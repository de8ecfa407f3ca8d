"""UniLab's robot tasks as a source (`env.batched: unilab`, issue 56): its tasks make, reset and step
through the adapter with their meshes from installed packages; each reward term is summed over an
episode to what the env's rewards add up to; a spec's kwargs change the task's settings but cannot
make UniLab import code; a run's copies are measured before it starts and a spec that would not fit
is refused with the largest count that does; the Go2 recipes run; aa-ray's Go2 mirror is one that
MuJoCo's dynamics respect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("unilab", reason="UniLab is an optional extra: pip install -e '.[unilab]'")

from aa_ray.envs import memory  # noqa: E402
from aa_ray.envs.batched import BatchedEnvError  # noqa: E402
from aa_ray.envs.unilab import TASKS, make_unilab_env  # noqa: E402
from aa_ray.errors import SpecError  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
GO2 = SPECS / "robots" / "go2_ppo.yaml"


@pytest.mark.parametrize("task", ["Go2JoystickFlat", "G1WalkFlat"])
def test_a_unilab_task_makes_resets_steps_and_sums_its_reward_terms(task: str) -> None:
    envs = make_unilab_env(task, 4, max_episode_steps=6)
    try:
        assert envs.obs_dims.groups[0][0] == "obs" and envs.obs_dims.groups[1][0] == "critic"
        assert envs.action_low.tolist() == [-1.0] * envs.act_dim
        obs = envs.reset(seed=3)
        assert obs.shape == (4, envs.obs_dims.full) and torch.isfinite(obs).all()
        returns, ended_early = torch.zeros(4), torch.zeros(4, dtype=torch.bool)
        for _ in range(6):
            result = envs.step(torch.zeros(4, envs.act_dim))
            returns += result.reward
            ended_early |= result.terminated
        whole = ~ended_early  # the copies whose one episode is these 6 steps
        assert whole.any() and result.truncated[whole].all(), "max_episode_steps sets the time limit"
        terms = {key: values for key, (values, mask) in result.episode_info.items() if key.startswith("reward/")}
        assert set(terms) == {f"reward/{term}" for term in envs.reward_terms}
        summed = sum(terms.values())
        assert torch.allclose(summed[whole], returns[whole], rtol=1e-4, atol=1e-5), "the terms add up to the return"
        assert (result.next_obs != result.obs).any(), "the final observations are kept beside the fresh ones"
    finally:
        envs.close()


def test_kwargs_change_the_task_but_never_name_code() -> None:
    envs = make_unilab_env("Go2JoystickFlat", 2, **{"commands.twist.ranges.lin_vel_x": [0.7, 0.7],
                                                    "commands.twist.ranges.lin_vel_y": [0.0, 0.0],
                                                    "commands.twist.ranges.ang_vel_z": [0.0, 0.0]})
    try:
        obs = envs.reset(seed=0)
        command = obs[:, 42:45]  # gyro, gravity, 12 joint positions, 12 velocities, 12 last actions, the command
        assert torch.allclose(command, torch.tensor([0.7, 0.0, 0.0]).expand(2, 3))
    finally:
        envs.close()
    with pytest.raises(BatchedEnvError, match="no import paths"):
        make_unilab_env("Go2JoystickFlat", 2, **{"rewards.tracking_lin_vel.func": "os:system"})
    with pytest.raises(BatchedEnvError, match="no import paths"):
        make_unilab_env("Go2JoystickFlat", 2, **{"rewards.tracking_lin_vel": {"func": "os.system", "weight": 1.0}})
    with pytest.raises(BatchedEnvError, match="is a section of UniLab's task configuration"):
        make_unilab_env("Go2JoystickFlat", 2, **{"rewards.tracking_lin_vel": "os"})
    with pytest.raises(BatchedEnvError, match="is not an entry of UniLab's task configuration"):
        make_unilab_env("Go2JoystickFlat", 2, **{"commands.twist.speed": 1.0})
    with pytest.raises(BatchedEnvError, match="Did you mean Go2JoystickFlat"):
        make_unilab_env("Go2JoystickFlatt", 2)
    assert set(TASKS) >= {"Go2JoystickFlat", "G1WalkFlat"}


def test_a_run_that_would_not_fit_is_refused_with_the_count_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies are measured for real (a child process makes the env); only the memory this machine
    has is made small, as on a laptop."""
    spec = load_spec(GO2, ["runners.envs_per_runner=4096", "eval.episodes=16"])
    found = memory.estimate(spec)
    # Go2's copies are light (about 0.13 MiB each, near the resident set's noise): PPO's rollout is most of it
    assert found is not None and found.total > 0 and found.copies == 4096 + 16
    monkeypatch.setattr(memory, "available_memory", lambda: int(found.total * 0.5))
    refusal = r"runners.envs_per_runner: 1 runner\(s\) x 4096 copies of Go2JoystickFlat"
    with pytest.raises(SpecError, match=refusal) as err:
        load_spec(GO2, ["runners.envs_per_runner=4096", "eval.episodes=16"])
    largest = int(str(err.value).split("at most ")[1].split(" copies")[0])
    assert 0 < largest < 4096
    smaller = load_spec(GO2, [f"runners.envs_per_runner={largest}", "eval.episodes=16"])
    assert memory.estimate(smaller).fits, "the count the refusal names fits"


def test_fastsac_and_ppo_recipes_run_on_go2_and_export_a_policy_reading_obs(tmp_path: Path) -> None:
    """The shipped Go2 recipes, shrunk to a few updates inline: each runs, evaluates with every reward
    term and the command's errors, records the evaluation's video (the robot drawn offscreen), and its
    policy reads the actor group `obs` alone."""
    from PIL import Image

    from aa_ray.api import load_policy
    from aa_ray.runtime.trainer import Trainer

    fastsac = ["algo.warm_up_steps=64", "algo.batch_size=64", "algo.buffer_size=4096"]
    ppo = ["algo.train_every=8", "eval.video=true", "eval.video_max_frames=6"]
    for recipe, shrink in (("go2_fastsac.yaml", fastsac), ("go2_ppo.yaml", ppo)):
        spec = load_spec(SPECS / "robots" / recipe, [
            "runtime.backend=inline", "runners.envs_per_runner=8", "budget.env_steps=192", "eval.every_env_steps=192",
            "eval.episodes=2", "env.max_episode_steps=16", "checkpoint.every_env_steps=null", "tracking.enabled=false",
            "algo.actor_hidden_dims=[32]", "algo.critic_hidden_dims=[32]", *shrink])
        result = Trainer(spec, run_dir=tmp_path / recipe, live=False).run()
        evaluation = result.evals[-1]
        assert {"eval/reward/tracking_lin_vel", "eval/command_error_vel_xy"} <= set(evaluation), sorted(evaluation)
        assert evaluation["eval/length"] == 16
        policy = load_policy(result.checkpoint)
        assert policy.obs_keys == ("obs",) and policy.obs_dim == 49
        assert policy.predict(np.zeros(49, np.float32)).shape == (12,)
    gif = Image.open(next((tmp_path / "go2_ppo.yaml" / "videos").glob("eval_*.gif")))
    assert gif.n_frames == 6 and gif.size == (320, 240)


def _mirror_block(mirror, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """The permutation and signs the mirror applies to observation features start..stop, as their own."""
    perm = np.asarray(mirror.obs_perm[start:stop]) - start
    assert perm.min() >= 0 and perm.max() < stop - start, "the block maps onto itself"
    return perm, np.asarray(mirror.obs_sign[start:stop])


def _equivariance_error(model, mirror, joints: tuple[np.ndarray, np.ndarray], rng: np.random.Generator,
                        states: int = 200) -> float:
    """The largest gap, over random states near standing, between the mirror of a state stepped with an
    action and the mirrored state stepped with the mirrored action (MuJoCo itself, the task's model)."""
    import mujoco

    joint_perm, joint_sign = joints
    _, base_sign = _mirror_block(mirror, 98, 101)  # the base's linear velocity: (x, -y, z), as its position
    _, spin_sign = _mirror_block(mirror, 0, 3)  # the gyro: (-wx, wy, -wz), as the quaternion's vector part

    def mirrored(qpos: np.ndarray, qvel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        qpos, qvel = qpos.copy(), qvel.copy()
        qpos[0:3] *= base_sign
        qpos[4:7] *= spin_sign
        qpos[7:] = qpos[7:][joint_perm] * joint_sign
        qvel[0:3] *= base_sign
        qvel[3:6] *= spin_sign
        qvel[6:] = qvel[6:][joint_perm] * joint_sign
        return qpos, qvel

    home = model.key("home")
    worst = 0.0
    for _ in range(states):
        qpos = home.qpos.copy()
        qpos[2] += rng.uniform(0.0, 0.05)
        tilt = rng.normal(0.0, 0.1, 3)
        mujoco.mju_axisAngle2Quat(qpos[3:7], tilt / max(np.linalg.norm(tilt), 1e-9), np.linalg.norm(tilt))
        qpos[7:] += rng.uniform(-0.3, 0.3, 12)
        qvel = rng.normal(0.0, 0.5, model.nv)
        ctrl = home.ctrl + rng.uniform(-0.4, 0.4, model.nu)
        results = []
        for q, v, u in ((qpos, qvel, ctrl), (*mirrored(qpos, qvel), mirror.action(ctrl))):
            data = mujoco.MjData(model)
            data.qpos[:], data.qvel[:], data.ctrl[:] = q, v, u
            mujoco.mj_step(model, data, nstep=4)
            results.append((data.qpos.copy(), data.qvel.copy()))
        expected = np.concatenate(mirrored(*results[0]))
        worst = max(worst, float(np.abs(np.concatenate(results[1]) - expected).max()))
    return worst


def test_go2s_mirror_is_an_involution_and_mujoco_steps_mirrored_states_into_mirrored_states() -> None:
    """aa-ray's Go2 mirror, read back as the joint, velocity and action maps it applies, drives UniLab's own
    Go2 model: 200 random states and actions and their mirrors stay mirrors after a step. The same check
    fails for a mirror with its hips' signs or its legs' pairing wrong."""
    import mujoco

    from aa_ray.envs.symmetry import Mirror, mirror_for
    from aa_ray.envs.unilab import robot_model_file

    mirror = mirror_for("Go2JoystickFlat")
    x = np.random.default_rng(1).normal(size=(5, 101)).astype(np.float32)
    assert np.array_equal(mirror.obs(mirror.obs(x)), x) and mirror.obs_dim == 101 and mirror.act_dim == 12
    model = mujoco.MjModel.from_xml_path(str(robot_model_file(TASKS["Go2JoystickFlat"], "scene_flat.xml")))
    assert [model.joint(j).name for j in range(1, 13)][:3] == ["FL_hip_joint", "FL_thigh_joint", "FL_calf_joint"]
    assert [model.actuator(a).name for a in range(3)] == ["FR_hip", "FR_thigh", "FR_calf"]
    # the task's actions are offsets from the standing pose, so they mirror as the targets do where it is symmetric
    home = model.key("home").ctrl
    assert np.allclose(mirror.action(home), home)
    joints = _mirror_block(mirror, 6, 18)  # joint positions, in qpos order
    # MuJoCo's contacts are not exactly symmetric in floating point: the gap stays under 0.01 (here 0.008 at
    # most) against more than 10 for a wrong mirror
    assert _equivariance_error(model, mirror, joints, np.random.default_rng(0)) < 0.05
    hips_kept = (joints[0], np.abs(joints[1]))
    assert _equivariance_error(model, mirror, hips_kept, np.random.default_rng(0), states=20) > 1.0
    front_with_back = (np.r_[6:12, 0:6], joints[1])
    assert _equivariance_error(model, mirror, front_with_back, np.random.default_rng(0), states=20) > 1.0
    wrong_actions = Mirror(mirror.obs_perm, mirror.obs_sign, mirror.act_perm, (1.0,) * 12)
    assert _equivariance_error(model, wrong_actions, joints, np.random.default_rng(0), states=20) > 1.0
