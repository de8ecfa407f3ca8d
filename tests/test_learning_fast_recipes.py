"""The FastTD3 and FastSAC recipes learn: short real runs of the shipped specs in this process.

On pusher-reach (specs/fasttd3.yaml, specs/fastsac.yaml: 16 MuJoCo envs per fleet step, 4 critic
updates of 256 rows after each, C51 critics) each run stops once the mean final eval distance is
under 0.05 m. An update that does not learn stays far from it: measured over the same 20k env steps,
a frozen actor (lr 1e-9) ends 0.256 m away, a frozen critic 0.137 m (fast_td3) and 0.163 m (fast_sac).

On PointReach in runtime.mode device (specs/fasttd3_point_reach.yaml: 1024 copies stepped in one
call, a replay ring beside the learner), the run stops once the mean final distance is under 5 cm; a
policy that has not learned ends about 1 m away (the first evaluation, at 51k env steps: 1.09-1.56)."""

from __future__ import annotations

import pytest
from learning_runs import train

pytestmark = pytest.mark.learning
SOLVED = "budget.stop_at={metric: eval/distance, below: 0.05}"


def solved(result: dict) -> list[float]:
    distances = [e["eval/distance"] for e in result["evals"]]
    assert result["stop_reason"] == "target reached", f"eval distances: {distances}"
    return distances


def test_fast_td3_solves_pusher_reach_within_20k_steps() -> None:
    """Seeds 0, 1, 2 solved it at 8,032, 10,048 and 14,000 env steps (30-65 s on 2 shared cores)."""
    result = train("fasttd3.yaml", "budget.env_steps=20000", SOLVED)
    distances = solved(result)
    print(f"fast_td3 solved pusher-reach at {result['env_steps']} env steps; eval distances {distances}")


def test_fast_sac_solves_pusher_reach_within_20k_steps() -> None:
    """Seeds 0, 1, 2 solved it at 8,032, 8,032 and 14,000 env steps (35-90 s on 2 shared cores)."""
    result = train("fastsac.yaml", "budget.env_steps=20000", SOLVED)
    distances = solved(result)
    print(f"fast_sac solved pusher-reach at {result['env_steps']} env steps; eval distances {distances}")


def test_fast_td3_solves_point_reach_on_the_device_path_within_400k_steps() -> None:
    """Seeds 0, 1, 2 solved it at 153,600, 153,600 and 204,800 env steps (19-25 s on 2 shared cores)."""
    result = train("fasttd3_point_reach.yaml", "budget.env_steps=400000")
    distances = solved(result)
    print(f"fast_td3 solved point-reach at {result['env_steps']} env steps; eval distances {distances}")
