"""Robot tasks by name (issue 56): every robot task EnvPool ships here makes, resets and steps through
the adapter with its observation groups laid out for an asymmetric actor-critic without lists in the
spec; each reward term is summed over an episode as the env reported it step by step; `aa-ray robots`
lists them; a spec that asks for what a task lacks is one paragraph."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

envpool = pytest.importorskip("envpool", reason="EnvPool is an optional extra: pip install -e '.[envpool]'")

from aa_ray import cli  # noqa: E402
from aa_ray.envs import env_dims  # noqa: E402
from aa_ray.envs.batched import make_batched_env  # noqa: E402
from aa_ray.envs.robots import robot_tasks  # noqa: E402
from aa_ray.errors import SpecError  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
TASKS = robot_tasks()
GO1 = "Go1JoystickFlatTerrain-v1"
# the tasks issue 56 names (robots of every kind: quadrupeds, humanoids, a hand, arms): each is made, reset
# and stepped; the catalog test reads every task's spec, which makes no env
NAMED = ("Go1JoystickFlatTerrain-v1", "Go1JoystickRoughTerrain-v1", "Go1Getup-v1", "Go1Handstand-v1",
         "G1JoystickFlatTerrain-v1", "T1JoystickFlatTerrain-v1", "BerkeleyHumanoidJoystickFlatTerrain-v1",
         "SpotFlatTerrainJoystick-v1", "H1JoystickGaitTracking-v1", "Op3Joystick-v1", "LeapCubeRotateZAxis-v1",
         "PandaPickCube-v1", "PandaOpenCabinet-v1", "AlohaHandOver-v1")
MADE = [task for task in TASKS if task.env_id in NAMED]


def test_the_catalog_holds_the_robots_users_train() -> None:
    by_id = {task.env_id: task for task in TASKS}
    assert set(NAMED) <= set(by_id), set(NAMED) - set(by_id)
    assert all(task.groups and task.act_dim and task.episode_steps and task.reward_terms for task in TASKS)
    go1 = by_id[GO1]
    assert go1.groups == (("state", 48), ("privileged_state", 123)) and go1.act_dim == 12
    assert (go1.control_hz, go1.episode_steps) == (50, 1000)
    assert {"tracking_lin_vel", "tracking_ang_vel", "feet_slip"} <= set(go1.reward_terms)




@pytest.mark.parametrize("task", MADE, ids=[task.env_id for task in MADE])
def test_every_named_robot_task_makes_resets_and_steps(task) -> None:
    envs = make_batched_env("envpool", task.env_id, 2, num_threads=1)
    try:
        keys = [key for key, _ in task.groups]
        if keys == ["state", "privileged_state"]:  # the asymmetric default: no lists in the spec
            assert envs.obs_dims.actor_keys == ("state",) and envs.obs_dims.groups == task.groups
        assert envs.obs_dims.full == sum(size for _, size in task.groups) and envs.act_dim == task.act_dim
        obs = envs.reset(seed=0)  # the seed the pool was made with: no second pool
        step = envs.step(torch.zeros(2, task.act_dim))
        for flat in (obs, step.obs):
            assert flat.dtype == torch.float32 and flat.shape == (2, envs.obs_dims.full)
        assert torch.isfinite(step.obs).all() and torch.isfinite(step.reward).all()
        assert set(envs.info_keys) >= {f"reward/{term}" for term in task.reward_terms}
    finally:
        envs.close()


def test_reward_terms_are_summed_over_each_episode() -> None:
    """Stepped beside a raw EnvPool pool of the same seed, the adapter's reward/<term> at an episode's end
    is the sum of the term over that episode's steps, not counting the reset step after it."""
    steps, seed = 12, 7
    envs = make_batched_env("envpool", GO1, 3, num_threads=1, max_episode_steps=steps)
    raw = envpool.make_gymnasium(GO1, num_envs=3, batch_size=3, seed=seed, num_threads=1, max_episode_steps=steps)
    envs.reset(seed=seed)
    raw.reset()
    sums, ended = np.zeros(3), 0
    generator = torch.Generator().manual_seed(0)
    for _ in range(2 * steps + 2):
        action = torch.rand((3, 12), generator=generator) * 2 - 1
        step = envs.step(action)
        _, reward, _, _, info = raw.step(action.numpy())
        valid = step.valid.numpy()
        np.testing.assert_allclose(step.reward.numpy()[valid], reward[valid], rtol=1e-6)  # the same episodes
        sums += np.where(valid, info["reward_tracking_lin_vel"], 0.0)
        done = (step.terminated | step.truncated).numpy()
        values, mask = step.episode_info["reward/tracking_lin_vel"]
        assert np.array_equal(mask.numpy(), done)
        np.testing.assert_allclose(values.numpy()[done], sums[done], rtol=1e-5)
        sums[done] = 0.0
        ended += int(done.sum())
    assert ended >= 3  # every copy finished an episode
    envs.close()
    raw.close()


def test_robots_command_lists_the_tasks(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["robots"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith(GO1 + " "))
    assert "Unitree Go1" in line and "state 48, privileged_state 123" in line and "50 Hz" in line
    unilab = [line for line in out.splitlines() if line.rstrip().endswith("  unilab")]
    if importlib.util.find_spec("unilab") is not None:  # UniLab's tasks, read from a one-copy env each
        go2 = next(line for line in unilab if line.startswith("Go2JoystickFlat "))
        assert "Unitree Go2" in go2 and "obs 49, critic 52" in go2 and "1000 steps" in go2 and "9  " in go2
    assert f"{len(TASKS) + len(unilab)} tasks" in out


def test_a_spec_asking_what_a_robot_task_lacks_is_one_paragraph() -> None:
    go1 = ["env.id=Go1JoystickFlatTerrain-v1", "env.batched=envpool", "runners.envs_per_runner=2"]
    with pytest.raises(SpecError, match="algo.sym_aug needs mirror transforms for env 'Go1JoystickFlatTerrain-v1'"):
        load_spec(SPECS / "ppo.yaml", [*go1, "algo.sym_aug=true"])
    with pytest.raises(SpecError, match="no key .policy. .its keys: privileged_state, state"):
        env_dims(load_spec(SPECS / "ppo.yaml", [*go1, "algo.actor_obs=[policy]"]))
    with pytest.raises(SpecError, match="Did you mean Go1JoystickFlatTerrain-v1"):
        env_dims(load_spec(SPECS / "ppo.yaml", [*go1, "env.id=Go1JoystickFlatTerain-v1"]))
    spec = load_spec(SPECS / "ppo.yaml", [*go1, "budget.stop_at={metric: eval/reward/tracking_lin_vel, above: 5}"])
    assert spec.budget.stop_at.metric == "eval/reward/tracking_lin_vel"


def test_ppo_trains_go1_from_its_recipe_and_logs_each_reward_term(tmp_path: Path) -> None:
    """The shipped recipe, shrunk to a few updates inline: it runs, evaluates and exports, the run's
    metrics hold every reward term, and the exported policy reads `state` alone."""
    from aa_ray.api import load_policy
    from aa_ray.runtime.trainer import Trainer

    spec = load_spec(SPECS / "robots" / "go1_ppo.yaml", [
        "runtime.backend=inline", "runners.envs_per_runner=4", "algo.train_every=8", "budget.env_steps=96",
        "eval.every_env_steps=96", "eval.episodes=2", "env.max_episode_steps=12", "checkpoint.every_env_steps=null",
        "tracking.enabled=false", "algo.actor_hidden_dims=[32]", "algo.critic_hidden_dims=[32]"])
    result = Trainer(spec, run_dir=tmp_path / "run", live=False).run()
    go1 = next(task for task in TASKS if task.env_id == GO1)
    evaluation = result.evals[-1]
    assert {f"eval/reward/{term}" for term in go1.reward_terms} <= set(evaluation), sorted(evaluation)
    assert evaluation["eval/length"] == 12
    policy = load_policy(result.checkpoint)
    assert policy.obs_keys == ("state",) and policy.obs_dim == 48
    assert policy.predict(np.zeros(48, np.float32)).shape == (12,)


KILLED_FOR_MEMORY = """
import ray
from aa_ray.runtime.remote import ActorLost, get_results
ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")

@ray.remote
class Runner:
    def sample(self):
        import time
        time.sleep(60)

try:
    get_results(Runner.remote().sample.remote())
except ActorLost as err:
    print("LOST", err)
"""


def test_an_actor_killed_for_memory_is_one_line_naming_the_node_and_its_memory() -> None:
    """Ray's memory monitor (here told that the node is full at 1% of its memory) kills the actor; the
    run sees one line (node, memory, the actor, what to change), not Ray's forty-line report."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KILLED_FOR_MEMORY], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_memory_usage_threshold": "0.01",
                               "RAY_memory_monitor_refresh_ms": "100"})
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LOST")]
    assert "killed by Ray's memory monitor: node " in line and " GB of " in line, line
    assert "it killed Runner" in line and "runners.envs_per_runner" in line, line
    assert "Object store memory usage" not in done.stdout
