"""The FastTD3 and FastSAC recipes learn: short real runs of the shipped specs in this process.

On pusher-reach (specs/fasttd3.yaml, specs/fastsac.yaml: 16 MuJoCo envs per fleet step, 4 critic
updates of 256 rows after each, C51 critics) each run stops once the mean final eval distance is
under 0.05 m. An update that does not learn stays far from it: measured over the same 20k env steps,
a frozen actor (lr 1e-9) ends 0.256 m away, a frozen critic 0.137 m (fast_td3) and 0.163 m (fast_sac).

On PointReach in runtime.mode device (specs/fasttd3_point_reach.yaml: 1024 copies stepped in one
call, a replay ring beside the learner), the run stops once the mean final distance is under 5 cm; a
policy that has not learned ends about 1 m away (the first evaluation, at 51k env steps: 1.09-1.56).

Before them, two quick checks of what the recipes add beside the learning runs: FastTD3's per-env
exploration noise, and its clipped double-Q on distributions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from learning_runs import train

from aa_ray.algos.fast_td3 import FastTD3Config, make_policy, project_each_critic, spread_noise_scales
from aa_ray.algos.losses import pessimistic_distribution
from aa_ray.nets.distributional import make_support, project_distribution
from aa_ray.records import ObsDims

SOLVED = "budget.stop_at={metric: eval/distance, below: 0.05}"


def solved(result: dict) -> list[float]:
    distances = [e["eval/distance"] for e in result.evals]
    assert result.stop_reason == "target reached", f"eval distances: {distances}"
    return distances


def test_fast_td3_explores_each_env_copy_with_a_noise_scale_of_its_own() -> None:
    """Row i of the observations (env copy i of 4) gets noise of std 0.1 + 0.2 (i + 1/2) / 4; acting
    deterministically adds none; numpy observations give numpy actions, a tensor a tensor."""
    cfg = FastTD3Config(actor_hidden_dims=[8], critic_hidden_dims=[8], exploration_noise_min=0.1,
                        exploration_noise_max=0.3)
    policy = make_policy(cfg, ObsDims(3, 3), 2)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    mean = policy.act(obs, deterministic=True)
    generator = torch.Generator().manual_seed(0)
    noise = np.stack([policy.act(obs, deterministic=False, generator=generator) - mean for _ in range(4000)])
    expected = spread_noise_scales(4, 0.1, 0.3).squeeze(-1).numpy()
    np.testing.assert_allclose(expected, [0.125, 0.175, 0.225, 0.275], rtol=1e-6)
    np.testing.assert_allclose(noise.std(axis=(0, 2)), expected, rtol=0.05)
    assert isinstance(mean, np.ndarray) and np.abs(mean).max() < 0.2  # the small output layer: near the middle
    acted = policy.act(torch.from_numpy(obs), deterministic=False, generator=generator)
    assert isinstance(acted, torch.Tensor) and acted.shape == (4, 2) and acted.abs().max() <= 1.0


def test_the_pessimistic_projection_is_fasttd3s_where_the_support_holds_the_target() -> None:
    """fast_td3 projects the slow critic whose next distribution has the lower mean; FastTD3 projects
    both and keeps the one whose projection has the lower mean. Where no atom falls off the support
    the two are the same distribution, row for row; and each critic's own projection (no clipped
    double-Q) is the projection of that critic's row."""
    g = torch.Generator().manual_seed(0)
    support = make_support(51, -10.0, 10.0)
    next_logits = torch.randn(2, 64, 51, generator=g) * 3  # (critics, rows, atoms)
    next_logits[..., :10] -= 30.0  # no mass near the ends: r + bootstrap z stays inside [-10, 10]
    next_logits[..., -10:] -= 30.0
    reward, bootstrap = torch.rand(64, generator=g) - 0.5, torch.full((64,), 0.97**3)
    each = project_each_critic(torch.softmax(next_logits, -1), reward, bootstrap, support)  # (2, 64, 51)
    for critic in range(2):
        torch.testing.assert_close(
            each[critic], project_distribution(torch.softmax(next_logits[critic], -1), reward, bootstrap, support)
        )
    lower = (each * support).sum(-1).argmin(dim=0)
    fasttd3s = each[lower, torch.arange(64)]
    ours = project_distribution(pessimistic_distribution(next_logits, support), reward, bootstrap, support)
    torch.testing.assert_close(ours, fasttd3s)
    assert (lower == 0).any() and (lower == 1).any()  # both critics were the pessimist somewhere


@pytest.mark.learning
def test_fast_td3_solves_pusher_reach_within_20k_steps() -> None:
    """Seeds 0, 1, 2 solved it at 8,032, 10,048 and 14,000 env steps (30-65 s on 2 shared cores)."""
    result = train("fasttd3.yaml", "budget.env_steps=20000", SOLVED)
    distances = solved(result)
    print(f"fast_td3 solved pusher-reach at {result.env_steps} env steps; eval distances {distances}")


@pytest.mark.learning
def test_fast_sac_solves_pusher_reach_within_20k_steps() -> None:
    """Seeds 0, 1, 2 solved it at 8,032, 8,032 and 14,000 env steps (35-90 s on 2 shared cores)."""
    result = train("fastsac.yaml", "budget.env_steps=20000", SOLVED)
    distances = solved(result)
    print(f"fast_sac solved pusher-reach at {result.env_steps} env steps; eval distances {distances}")


@pytest.mark.learning
def test_fast_td3_solves_point_reach_on_the_device_path_within_400k_steps() -> None:
    """Seeds 0, 1, 2 solved it at 153,600, 153,600 and 204,800 env steps (19-25 s on 2 shared cores)."""
    result = train("fasttd3_point_reach.yaml", "budget.env_steps=400000")
    distances = solved(result)
    print(f"fast_td3 solved point-reach at {result.env_steps} env steps; eval distances {distances}")
