"""The shared off-policy knobs against hand-computed cases: expectile loss, BEE target, reward
normalization, gradient clipping, Huber loss, mixed precision, Muon."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.gradient_step import GradientStep
from aa_ray.algos.losses import bee_target, expectile_loss, rlpd_diagnostics, td_loss
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.optimizers import make_optimizer
from aa_ray.algos.sac import SAC, SACConfig
from aa_ray.algos.schedules import scheduled_lr
from aa_ray.errors import SpecError
from aa_ray.records import Batch, ObsDims, prior_rows
from aa_ray.spec.loader import validate_spec


def one_batch(n: int = 4, obs_dim: int = 3, terminated: float = 0.0) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        obs=torch.randn(n, obs_dim, generator=g),
        action=torch.rand(n, 1, generator=g) * 2 - 1,
        reward=torch.tensor([0.5, -1.0, 2.0, 0.0])[:n],
        next_obs=torch.randn(n, obs_dim, generator=g),
        terminated=torch.full((n,), terminated),
        discount=torch.full((n,), 0.9),
    )


def test_expectile_loss_by_hand() -> None:
    prediction = torch.zeros(2)
    target = torch.tensor([1.0, -1.0])
    # under-prediction (err +1) weighs 0.7, over-prediction (err -1) weighs 0.3: mean(0.7, 0.3)
    assert expectile_loss(prediction, target, 0.7).item() == pytest.approx(0.5)
    assert expectile_loss(prediction, target, 0.5).item() == pytest.approx(0.5)
    # an optimistic expectile's minimiser lies above the mean of the targets
    v = torch.zeros((), requires_grad=True)
    opt = torch.optim.SGD([v], lr=0.5)
    for _ in range(200):
        opt.zero_grad()
        expectile_loss(v.expand(2), target, 0.7).backward()
        opt.step()
    assert v.item() == pytest.approx(0.4, abs=1e-3)  # 0.7 (1 - v) = 0.3 (v + 1)


def test_bee_target_with_lambda_one_is_r_plus_discounted_v() -> None:
    """lambda = 1: the target is the exploitation target r + gamma^k V(s') alone."""
    torch.manual_seed(0)
    algo = SAC(SACConfig(learn_v=True, bee_lambda=1.0, actor_hidden_dims=[16],
        critic_hidden_dims=[16]), ObsDims.of(3), 1, TrainingSetup.on_cpu())
    b = one_batch()
    info = algo.update(Batch(*(t.unsqueeze(0) for t in b)))  # the critic step, then the actor (V untouched)
    with torch.no_grad():
        expected = (b.reward + 0.9 * algo.agent.value(b.next_obs)).mean().item()  # V after its own step
    assert float(info["critic/td_target"]) == pytest.approx(expected, rel=1e-5)
    assert "critic/q_upper" in info and "critic/v_loss" in info
    # and the mix itself: lambda weighs r + bootstrap V(s') against the soft target
    soft, reward, bootstrap, v = torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([0.9]), torch.tensor([2.0])
    assert bee_target(soft, reward, bootstrap, v, 0.25).item() == pytest.approx(0.25 * (0.5 + 0.9 * 2.0) + 0.75 * 1.0)


def test_bee_needs_learn_v_and_says_so() -> None:
    raw = {
        "name": "x",
        "env": {"id": "Pendulum-v1"},
        "budget": {"env_steps": 10_000},
        "algo": {"name": "sac", "bee_lambda": 0.5},
    }
    with pytest.raises(SpecError, match="bee_lambda > 0 needs learn_v"):
        validate_spec(raw)


def test_reward_normalizer_statistics() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(-2.0, 3.0, size=n) for n in (10, 200, 33)]
    plain, simba = RewardNormalizer(True), RewardNormalizer(True, v_max=5.0)
    for chunk in chunks:
        for norm in (plain, simba):
            norm.merge(len(chunk), chunk.mean(), chunk.var(), np.abs(chunk).max())
    everything = np.concatenate(chunks)
    assert float(plain.var) == pytest.approx(everything.var(), rel=1e-9)
    assert float(plain.scale()) == pytest.approx(1 / np.sqrt(everything.var() + 1e-8), rel=1e-6)
    # SimbaV2's scale also keeps the largest |return| inside the support of half-width v_max
    assert float(simba.scale()) == pytest.approx(1 / max(everything.std(), np.abs(everything).max() / 5.0), rel=1e-6)
    assert float(RewardNormalizer(False).scale()) == 1.0
    assert float(RewardNormalizer(True).scale()) == 1.0  # no statistics yet


def test_gradient_clipping_bounds_the_applied_step() -> None:
    """SGD with lr 1 moves the parameters by exactly the clipped gradient: its global norm (weight
    and bias together) is the clip, and both parts moved."""
    layer = torch.nn.Linear(4, 1)
    weight_before, bias_before = layer.weight.detach().clone(), layer.bias.detach().clone()
    step = GradientStep(
        torch.optim.SGD(layer.parameters(), lr=1.0), max_grad_norm=0.1, precision="fp32", device=torch.device("cpu")
    )
    norm = step((layer(torch.full((1, 4), 100.0)) ** 2).sum())
    assert float(norm) > 10.0  # the reported norm is the one before clipping
    weight_moved, bias_moved = layer.weight - weight_before, layer.bias - bias_before
    assert bias_moved.abs().sum() > 0 and weight_moved.abs().sum() > 0
    moved = torch.cat([weight_moved.flatten(), bias_moved.flatten()])
    assert torch.linalg.vector_norm(moved).item() == pytest.approx(0.1, rel=1e-4)


def test_learning_rate_schedule_is_linear_then_flat() -> None:
    assert scheduled_lr(1e-4, 0.5, 0, 100) == pytest.approx(1e-4)
    assert scheduled_lr(1e-4, 0.5, 50, 100) == pytest.approx(7.5e-5)
    assert scheduled_lr(1e-4, 0.5, 100, 100) == scheduled_lr(1e-4, 0.5, 1000, 100) == pytest.approx(5e-5)
    assert scheduled_lr(3e-4, 1.0, 70, 100) == pytest.approx(3e-4)  # 1.0 keeps it constant


def test_huber_td_loss_matches_torch_per_critic() -> None:
    q = torch.tensor([[0.0, 3.0], [1.0, -2.0]])
    target = torch.tensor([0.5, 0.0])
    expected = sum(torch.nn.functional.huber_loss(q[i], target, delta=1.0) for i in range(2))
    assert td_loss(q, target, "huber", 1.0).item() == pytest.approx(expected.item())
    assert td_loss(q, target, "mse", 1.0).item() == pytest.approx(((q - target) ** 2).mean(1).sum().item())


@pytest.mark.parametrize(("precision", "optimizer"), [("bf16", "adam"), ("fp16", "adam"), ("fp32", "muon")])
def test_precision_and_optimizer_variants_train(precision: str, optimizer: str) -> None:
    torch.manual_seed(0)
    cfg = SACConfig(actor_hidden_dims=[32, 32],
        critic_hidden_dims=[32, 32], precision=precision, optimizer=optimizer, max_grad_norm=10.0)
    algo = SAC(cfg, ObsDims.of(3), 1, TrainingSetup.on_cpu())
    stacked = Batch(*(t.unsqueeze(0) for t in one_batch()))
    losses = [float(algo.update(stacked)["critic/q_loss"]) for _ in range(30)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]


def test_prior_rows_and_q_gap() -> None:
    assert prior_rows(256, 0.5) == 128 and prior_rows(8, 0.25) == 2
    gap = rlpd_diagnostics(torch.tensor([[3.0, 3.0, 1.0, 1.0]]), "x.parquet", 0.5)
    assert float(gap["critic/prior_online_q_gap"]) == pytest.approx(2.0)
    assert rlpd_diagnostics(torch.zeros(1, 4), None, 0.5) == {}


def test_simba_networks_train_under_bf16_autocast() -> None:
    from aa_ray.algos.sac_simba import SACSimba, SACSimbaConfig

    torch.manual_seed(0)
    algo = SACSimba(
        SACSimbaConfig(precision="bf16", critic_hidden_dim=32, actor_hidden_dim=16), ObsDims.of(3), 1,
        TrainingSetup.on_cpu(),
    )
    info = algo.update(Batch(*(t.unsqueeze(0) for t in one_batch())))
    assert np.isfinite(float(info["critic/q_loss"])) and np.isfinite(float(info["actor/loss"]))


@pytest.mark.parametrize("kind", ["adam", "muon"])
def test_a_non_finite_step_leaves_parameters_and_optimizer_state_exactly_as_they_were(kind: str) -> None:
    """Fused Adam skips on its device flag; Muon (no fused skip) has its step undone on the device."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 1))
    optimizer = make_optimizer(net, kind, 1e-2)
    step = GradientStep(optimizer, max_grad_norm=1.0, precision="fp32", device=torch.device("cpu"))
    x = torch.randn(16, 4)
    step(net(x).pow(2).mean())
    parts = getattr(optimizer, "parts", (optimizer,))

    def snapshot() -> list[torch.Tensor]:
        state = [v for part in parts for s in part.state.values() for v in s.values() if torch.is_tensor(v)]
        return [t.detach().clone() for t in [*net.parameters(), *state]]

    before = snapshot()
    step(net(x).pow(2).mean() * float("nan"))
    assert all(torch.equal(a, b) for a, b in zip(snapshot(), before, strict=True))
    assert (int(step.skipped), int(step.consecutive_skips)) == (1, 1)
    step(net(x).pow(2).mean())
    assert not torch.equal(snapshot()[0], before[0]) and int(step.consecutive_skips) == 0
