"""PPO learns pusher-reach: a short real run (MuJoCo, in process) must beat the random policy by a
wide margin. PPO is far less sample-efficient than SAC here (SAC solves it in ~7k env steps), so
this asks for improvement, not a solve: the random policy ends 0.19 m from the target on average."""

from __future__ import annotations

import pytest
from learning_runs import train

pytestmark = pytest.mark.learning


def test_ppo_halves_the_random_policys_distance_within_200k_steps() -> None:
    """The shipped spec must bring the mean final eval distance to 0.10 m or less (random: 0.19 m)
    within 200k env steps; each 10k-step evaluation may stop it early. Seed 0 got there at 90k env
    steps on an AMD EPYC and at 121k on an Intel Xeon (float rounding differs): the budget leaves room."""
    result = train("ppo.yaml", "budget.env_steps=200000", "eval.every_env_steps=10000",
                   "budget.stop_at_eval_distance=0.10", "checkpoint.every_env_steps=null")
    distances = [round(e["eval/distance"], 4) for e in result.evals]
    assert result.stop_reason == "target reached", f"eval distances: {distances}"
    assert distances[-1] <= 0.10 and distances[0] > 0.10
    print(f"ppo reached {distances[-1]} m at {result.env_steps} env steps; eval distances {distances}")
