"""TD3 learns pusher-reach: a short real run (MuJoCo, in process) that stops once it is solved."""

from __future__ import annotations

import pytest
from learning_runs import NARROW, train

pytestmark = pytest.mark.learning


def test_td3_solves_pusher_reach_within_20k_steps() -> None:
    """TD3 must bring the mean final eval distance under 0.05 m within 20k env steps (128 wide: 0.048 m
    at 11k for seed 0, 31 s beside another run on 2 cores; at 256, 9k, 8k and 5k steps for seeds 0,
    1, 2; a random policy ends ~0.17 m away)."""
    result = train("td3.yaml", "budget.env_steps=20000", "budget.stop_at_eval_distance=0.05", *NARROW)
    distances = [e["eval/distance"] for e in result.evals]
    assert result.stop_reason == "target reached", f"eval distances: {distances}"
    assert distances[-1] < 0.05 and result.env_steps <= 20000
    print(f"td3 solved pusher-reach at {result.env_steps} env steps; eval distances {distances}")
