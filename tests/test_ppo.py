"""PPO: GAE, the surrogate losses and the adaptive learning rate against hand-computed values; an
on-policy runner's rollouts on a real env; two DDP learners on a real local Ray."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.ppo import PPO, adapt_lr, clipped_surrogate_loss, explained_variance, gae, spo_loss
from aa_ray.errors import SpecError
from aa_ray.records import ObsDims, Rollout
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.learner import Learner
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = ["tracking.enabled=false", "algo.actor_hidden_dims=[32,32]",
    "algo.critic_hidden_dims=[32,32]", "algo.train_every=16", "algo.num_minibatches=4"]


def ppo_spec(*overrides: str):
    return load_spec(SPECS / "ppo.yaml", [*SMALL, *overrides])


def test_gae_bootstraps_a_truncation_and_masks_a_termination() -> None:
    """One env, gamma 0.9, lambda 0.8: the episode is truncated after step 1 (its final observation
    is worth 9) and a new one terminates at step 3. By hand:
    deltas 1 + .9*1 - .5 = 1.4, 2 + .9*9 - 1 = 9.1, 3 + .9*2 - 1.5 = 3.3, 4 + 0 - 2 = 2;
    A3 = 2, A2 = 3.3 + .72*2 = 4.74, A1 = 9.1 (the episode ended), A0 = 1.4 + .72*9.1 = 7.952."""
    column = lambda *values: torch.tensor(values, dtype=torch.float64).unsqueeze(1)  # noqa: E731
    advantages, returns = gae(
        reward=column(1, 2, 3, 4), value=column(0.5, 1.0, 1.5, 2.0), next_value=column(1.0, 9.0, 2.0, 3.0),
        terminated=column(0, 0, 0, 1), truncated=column(0, 1, 0, 0), gamma=0.9, lam=0.8,
    )
    torch.testing.assert_close(advantages, column(7.952, 9.1, 4.74, 2.0))
    torch.testing.assert_close(returns, column(8.452, 10.1, 6.24, 4.0))


def test_clipped_surrogate_and_spo_losses() -> None:
    ratio, advantage = torch.tensor([0.5, 1.0, 1.5, 0.5]), torch.tensor([1.0, -1.0, 2.0, -1.0])
    # symmetric 0.2: min(r A, clip(r) A) = 0.5, -1, min(3, 2.4) = 2.4, min(-0.5, -0.8) = -0.8
    assert clipped_surrogate_loss(ratio, advantage, 0.2, 0.2).item() == pytest.approx(-(0.5 - 1 + 2.4 - 0.8) / 4)
    # asymmetric [0.1, 0.3]: 0.5, -1, min(3, 2.6) = 2.6, min(-0.5, -0.9) = -0.9
    assert clipped_surrogate_loss(ratio, advantage, 0.1, 0.3).item() == pytest.approx(-(0.5 - 1 + 2.6 - 0.9) / 4)
    # SPO at r = 1.5, A = 2, eps 0.2: r A - |A| (r - 1)^2 / (2 eps) = 3 - 2 * 0.25 / 0.4 = 1.75
    assert spo_loss(torch.tensor([1.5]), torch.tensor([2.0]), 0.2).item() == pytest.approx(-1.75)
    # at r = 1 both are just -E[A], with the gradient of the plain policy gradient
    assert spo_loss(torch.ones(4), advantage, 0.2).item() == pytest.approx(-advantage.mean().item())


def test_adaptive_lr_moves_against_the_kl() -> None:
    bounds, t = (1e-5, 1e-2), torch.tensor

    def adapted(lr: float, kl: float) -> float:
        return float(adapt_lr(t(lr, dtype=torch.float64), t(kl), desired_kl=0.01, bounds=bounds))

    assert adapted(1e-3, kl=0.05) == pytest.approx(1e-3 / 1.5)
    assert adapted(1e-3, kl=0.001) == pytest.approx(1.5e-3)
    assert adapted(1e-3, kl=0.01) == 1e-3
    assert adapted(1e-2, kl=0.0) == 1e-2  # capped
    assert adapted(1e-5, kl=0.05) == 1e-5  # floored
    assert float(explained_variance(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]))) == pytest.approx(1.0)
    assert np.isnan(float(explained_variance(torch.tensor([1.0, 2.0]), torch.tensor([5.0, 5.0]))))


@pytest.fixture(scope="module")
def rollout() -> tuple[dict, dict, EnvRunner]:
    """20 steps of 2 pusher-reach copies whose time limit is 6 steps (so 3 truncations each)."""
    runner = EnvRunner(ppo_spec("env.max_episode_steps=6", "runners.envs_per_runner=2"), index=0)
    data, stats = runner.sample_rollout(20)
    return data, stats, runner


def test_runner_rollouts_are_complete_on_policy_data(rollout: tuple[dict, dict, EnvRunner]) -> None:
    """Every row is a real step (same-step resets), truncations sit where the time limit is,
    log-probs are the acting policy's, and V(s') is V of the next row's observation except where an
    episode ended: there it is V of the final observation, not of the reset one."""
    data, stats, runner = rollout
    assert data.obs.shape == (20, 2, 10) and data.action.shape == (20, 2, 2)
    assert stats.env_steps == 40 and len(stats.episodes) == 6
    # the final step's info comes from final_info (same-step resets): pusher-reach's task metric and is_success
    assert all(e.length == 6 and set(e.info) == {"is_success", "distance"} for e in stats.episodes)
    ended = data.truncated.astype(bool)
    assert ended[5].all() and ended[11].all() and ended.sum() == 6 and not data.terminated.any()
    with torch.no_grad():
        policy = runner.policy
        obs = torch.as_tensor(data.obs)
        log_prob, _, _ = policy.actor(policy.obs_norm(obs), torch.as_tensor(data.action))
    np.testing.assert_allclose(log_prob.numpy(), data.log_prob, rtol=1e-5, atol=1e-5)
    continuing = ~ended[:-1]
    np.testing.assert_allclose(data.next_value[:-1][continuing], data.value[1:][continuing], rtol=1e-5)
    assert not np.allclose(data.next_value[:-1][ended[:-1]], data.value[1:][ended[:-1]])


def test_update_adapts_the_lr_toward_the_kl_target(rollout: tuple[dict, dict, EnvRunner]) -> None:
    """A KL target far below what an update moves the policy lowers the actor's lr; one far above
    raises it. The critic's lr stays put."""
    data, _, _ = rollout
    lrs = {}
    for desired_kl in (1e-7, 10.0):
        torch.manual_seed(0)
        algo = PPO(ppo_spec(f"algo.desired_kl={desired_kl}").algo, ObsDims.of(10), 2, TrainingSetup.on_cpu())
        info = algo.update(Rollout.from_chunk(data, torch.device("cpu")))
        lrs[desired_kl] = float(info["actor/lr"])
        assert algo.optimizer.param_groups[1]["lr"] == pytest.approx(1e-3)
        assert np.isfinite(float(info["actor/approx_kl"])) and float(info["actor/approx_kl"]) >= 0
    assert lrs[1e-7] < 1e-3 < lrs[10.0]


def test_spec_checks_the_envs_split_over_learners() -> None:
    with pytest.raises(SpecError, match="divisible by learners.num_learners"):
        ppo_spec("learners.num_learners=3")
    with pytest.raises(SpecError, match="needs an off-policy algorithm"):
        ppo_spec("runtime.mode=async")


def test_two_gloo_ppo_learners_stay_identical(rollout: tuple[dict, dict, EnvRunner]) -> None:
    """Two DDP learners, each on half of the envs, end every update with identical models and lr
    (global advantage statistics, averaged gradients and KL); their checkpoint loads in one learner."""
    data, stats, _ = rollout
    two = ppo_spec("learners.num_learners=2", "runners.envs_per_runner=2")
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        remote = ray.remote(Learner).options(num_cpus=1)
        ranks = [remote.remote(two, 10, 2, rank) for rank in range(2)]
        address = ray.get(ranks[0].rendezvous_address.remote(ray.util.get_node_ip_address()))
        ray.get([learner.join.remote(address) for learner in ranks])
        before = ray.get(ranks[0].parameters_vector.remote())
        for _ in range(3):
            reports = ray.get([learner.update.remote([stats.moments], data) for learner in ranks])
            infos = [report.metrics for report in reports]
        rank0, rank1 = ray.get([learner.parameters_vector.remote() for learner in ranks])
        state = ray.get(ranks[0].state_dict.remote())
    finally:
        ray.shutdown()
    assert (rank0 == rank1).all(), "the two ranks diverged"
    assert not torch.equal(rank0, before)
    assert infos[0]["actor/lr"] == infos[1]["actor/lr"]
    single = Learner(ppo_spec("runners.envs_per_runner=2"), 10, 2)
    single.load_state_dict(state)
    assert torch.equal(single.parameters_vector(), rank0)
