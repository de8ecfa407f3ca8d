"""The scale harness (`benchmarks/bench_scale.py`) at CI size: its synthetic env and learner plugin
behave as configured, and its smallest cell runs the real runtime on a 2-node local Ray cluster and
measures it. The measurements themselves stay out of CI (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.registry import load_plugin
from aa_ray.records import Batch, ObsDims

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # the folder that holds the scale_sim package
from scale_sim import ENV_ID  # noqa: E402
from scale_sim.env import SyntheticEnv  # noqa: E402


def test_the_synthetic_env_has_the_shapes_and_the_cost_it_is_given() -> None:
    env = gym.make(ENV_ID, obs_dim=5, act_dim=3, step_s=0.005)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (5,) and env.action_space.shape == (3,)
    start = time.perf_counter()
    for _ in range(10):
        obs, reward, terminated, truncated, _ = env.step(np.zeros(3, np.float32))
    assert time.perf_counter() - start >= 10 * 0.005
    assert reward == 0.0 and not terminated and not truncated
    with pytest.raises(ValueError, match="step_s"):
        SyntheticEnv(step_s=float("nan"))


def test_the_timed_learner_takes_its_time_per_update_and_learns_nothing() -> None:
    plugin = load_plugin("scale_sim.timed_learner")
    config = plugin.config(update_s=0.01, batch_size=8)
    algo = plugin.algorithm(config, ObsDims.of(4), 2, TrainingSetup.on_cpu(seed=0, planned_steps=10))
    before = {k: v.clone() for k, v in algo.policy_state().items()}
    batch = Batch(*(torch.zeros(3, 8, *shape) for shape in [(4,), (2,), (), (4,), (), ()]))
    start = time.perf_counter()
    diagnostics = algo.update(batch)
    assert time.perf_counter() - start >= 3 * 0.01  # three batches, three updates
    assert int(diagnostics["learner/simulated_updates"]) == 3
    assert all(torch.equal(before[k], v) for k, v in algo.policy_state().items())
    state = algo.state_dict()
    assert int(state["updates"]) == 3


def test_the_harness_measures_a_two_node_cluster(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_scale.py"), "--part", "tiny", "--seconds", "4",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (cell,) = json.loads(out.read_text())["tiny"]
    assert cell["status"] == "ok", cell
    assert cell["config"]["nodes"] == 2 and cell["iterations"] > 2
    # 4 runners of 2 envs with a 1 ms step: at most 4,000 env steps/s
    assert 0 < cell["env_steps_per_s"] <= cell["config"]["ideal"] * 1.05
    cpu = cell["cpu_us_per_transition"]
    assert {"EnvRunner", "ReplayBuffer", "Learner", "driver"} <= set(cpu), cpu  # every actor was seen working
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"))
    assert 0 < cell["learner_busy"] < 1  # its 1 ms updates, part of the wall time
    # the machine during the window: the cluster's CPU (its per-transition CPU at its rate) and everything
    # else's, in cores, together no more than the machine has; the load averages at the cell's end
    assert cell["cluster_cores"] == pytest.approx(cpu["total"] * 1e-6 * cell["env_steps_per_s"], rel=1e-6)
    assert cell["cluster_cores"] > 0 and cell["cluster_cores"] + cell["other_cores"] <= 1.05 * psutil.cpu_count()
    assert len(cell["load_average"]) == 3
    # the VM's speed through the window, read by the harness's probe process (kept out of the cluster's CPU)
    speed = cell["vm_speed"]
    assert speed["readings"] >= 2 and 0 < speed["fastest_us"] <= speed["median_us"], speed
    assert speed["slowdown"] == pytest.approx(speed["median_us"] / speed["fastest_us"], abs=0.01)
    # the replay actor on the learner's node (its samples move through shared memory), the runners on both
    placement = cell["placement"]
    assert placement["replay"] == placement["learners"] and len(placement["runners"]) == 4, placement
    assert set(placement["runners"]) == {0, 1}, placement
