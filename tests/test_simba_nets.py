"""Tests for the SimbaV2 networks in aa_ray.nets.simba (fast, CPU only)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from aa_ray.nets.simba import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    EnsembleHyperDense,
    HyperDense,
    HyperHead,
    HyperKernel,
    Scaler,
    SimbaV2Actor,
    SimbaV2Critic,
    SimbaV2Encoder,
    normalize_weights_,
)

OBS, ACT = 11, 3


@pytest.fixture(autouse=True)
def _seed_and_one_thread() -> Iterator[None]:
    # One intra-op thread: these nets are small, and on a shared/oversubscribed CI box extra
    # threads only add contention (it made this file ~10x slower under load).
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def kernels(module: nn.Module) -> list[HyperKernel]:
    return [m for m in module.modules() if isinstance(m, HyperKernel)]


def row_norms(k: HyperKernel) -> torch.Tensor:
    """Norm of every output unit's weight vector (per ensemble member)."""
    return k.weight.detach().norm(dim=k.kernel_norm_dim)


def assert_unit_kernels(module: nn.Module) -> None:
    ks = kernels(module)
    assert ks, "no HyperDense kernels found"
    for k in ks:
        torch.testing.assert_close(row_norms(k), torch.ones_like(row_norms(k)))


def small_critic(**kw: int) -> SimbaV2Critic:
    return SimbaV2Critic(OBS, ACT, **{"hidden_dim": 32, "num_blocks": 2, **kw})


def test_shapes() -> None:
    enc = SimbaV2Encoder(OBS, 16, num_blocks=2)
    assert enc(torch.randn(4, 5, OBS)).shape == (4, 5, 16)

    actor = SimbaV2Actor(OBS, ACT, hidden_dim=16)
    mean, log_std = actor(torch.randn(7, OBS))
    assert mean.shape == log_std.shape == (7, ACT)

    critic = small_critic(num_critics=3)
    assert critic(torch.randn(7, OBS), torch.randn(7, ACT)).shape == (3, 7)
    # Extra leading batch dims are kept after the ensemble dim.
    assert critic(torch.randn(2, 5, OBS), torch.randn(2, 5, ACT)).shape == (3, 2, 5)


def test_default_sizes() -> None:
    actor = SimbaV2Actor(OBS, ACT)
    critic = SimbaV2Critic(OBS, ACT)
    assert actor.encoder.hidden_dim == 128 and len(actor.encoder.blocks) == 1
    assert critic.encoder.hidden_dim == 512 and len(critic.encoder.blocks) == 2
    assert critic.num_critics == 2
    # Block MLP expands 4x.
    assert critic.encoder.blocks[0].w1.weight.shape == (2, 512, 2048)
    assert actor.encoder.blocks[0].w1.weight.shape == (512, 128)


def test_encoder_rows_are_unit_norm() -> None:
    enc = SimbaV2Encoder(OBS, 32, num_blocks=2)
    x = torch.randn(64, OBS) * 10.0
    torch.testing.assert_close(enc(x).norm(dim=-1), torch.ones(64))

    ens = SimbaV2Encoder(OBS, 32, num_blocks=2, ensemble_size=2)
    torch.testing.assert_close(ens(x).norm(dim=-1), torch.ones(2, 64))


def test_scaler_initial_values() -> None:
    hidden, blocks = 32, 3
    enc = SimbaV2Encoder(OBS, hidden, blocks)
    s = math.sqrt(2 / hidden)
    # The stored parameter starts at `scale`, the applied value at `init`.
    torch.testing.assert_close(enc.embed_scaler.scaler.detach(), torch.full((hidden,), s))
    torch.testing.assert_close(enc.embed_scaler.effective().detach(), torch.full((hidden,), s))
    block = enc.blocks[0]
    inner = math.sqrt(2 / (4 * hidden))
    torch.testing.assert_close(block.scaler.effective().detach(), torch.full((4 * hidden,), inner))
    torch.testing.assert_close(
        block.alpha.scaler.detach(), torch.full((hidden,), 1 / math.sqrt(hidden))
    )
    torch.testing.assert_close(
        block.alpha.effective().detach(), torch.full((hidden,), 1 / (blocks + 1))
    )
    sc = Scaler(4, init=0.5, scale=0.1)
    torch.testing.assert_close(sc(torch.ones(4)), torch.full((4,), 0.5))


def test_kernel_inventory() -> None:
    # Actor: embedder + 2 per block + 2 per head (mean, log-std); no biases in kernels.
    actor = SimbaV2Actor(OBS, ACT, hidden_dim=16, num_blocks=2)
    assert len(kernels(actor)) == 1 + 2 * 2 + 2 * 2
    assert all(isinstance(k, HyperDense) and k.bias is None for k in kernels(actor))
    critic = small_critic()
    assert len(kernels(critic)) == 1 + 2 * 2 + 2
    assert all(isinstance(k, EnsembleHyperDense) for k in kernels(critic))


@pytest.mark.parametrize("make", [lambda: SimbaV2Actor(OBS, ACT, hidden_dim=16), small_critic])
def test_normalize_weights(make: Callable[[], nn.Module]) -> None:
    net = make()
    assert_unit_kernels(net)  # projected at construction

    # Non-kernel parameters (scalers, head biases) must not be touched by the projection.
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(torch.rand_like(p) * 3 + 0.1).add_(0.05)
    kernel_ids = {id(k.weight) for k in kernels(net)}
    others = {n: p.detach().clone() for n, p in net.named_parameters() if id(p) not in kernel_ids}
    assert others
    normalize_weights_(net)
    assert_unit_kernels(net)
    for n, p in net.named_parameters():
        if n in others:
            torch.testing.assert_close(p.detach(), others[n])

    # A gradient step moves the kernels off the sphere; normalize_weights_ brings them back.
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    obs = torch.randn(32, OBS)
    out = net(obs)[0] if isinstance(net, SimbaV2Actor) else net(obs, torch.randn(32, ACT))
    out.square().mean().backward()
    opt.step()
    assert any(not torch.allclose(row_norms(k), torch.ones(1)) for k in kernels(net))
    normalize_weights_(net)
    assert_unit_kernels(net)


def test_log_std_bounds() -> None:
    actor = SimbaV2Actor(OBS, ACT, hidden_dim=16)
    _, log_std = actor(torch.randn(128, OBS) * 100)
    assert log_std.min() >= LOG_STD_MIN and log_std.max() <= LOG_STD_MAX
    # Saturate the head through its bias: the squash hits the bounds exactly, never beyond.
    with torch.no_grad():
        actor.log_std_head.bias.fill_(1e4)
    _, log_std = actor(torch.randn(8, OBS))
    torch.testing.assert_close(log_std, torch.full_like(log_std, LOG_STD_MAX))
    with torch.no_grad():
        actor.log_std_head.bias.fill_(-1e4)
    _, log_std = actor(torch.randn(8, OBS))
    torch.testing.assert_close(log_std, torch.full_like(log_std, LOG_STD_MIN))
    assert (LOG_STD_MIN, LOG_STD_MAX) == (-10.0, 2.0)


def test_critic_members_independent_and_all_params_get_grads() -> None:
    critic = small_critic()
    for k in kernels(critic):
        assert not torch.allclose(k.weight[0], k.weight[1])
    obs, act = torch.randn(16, OBS), torch.randn(16, ACT)
    q = critic(obs, act)
    assert not torch.allclose(q[0], q[1])

    # Each member's loss only reaches its own slice of the stacked parameters.
    q[0].sum().backward()
    for name, p in critic.named_parameters():
        assert p.grad is not None, name
        assert p.grad[0].abs().sum() > 0, name
        assert p.grad[1].abs().sum() == 0, name
    critic.zero_grad()
    act.requires_grad_(True)  # the actor loss needs dQ/da
    critic(obs, act).sum().backward()
    for name, p in critic.named_parameters():
        assert p.grad is not None and (p.grad.flatten(1).abs().sum(1) > 0).all(), name
    assert act.grad is not None and (act.grad.abs().sum(-1) > 0).all()


def test_actor_all_params_get_grads() -> None:
    actor = SimbaV2Actor(OBS, ACT, hidden_dim=16)
    mean, log_std = actor(torch.randn(16, OBS))
    (mean.sum() + log_std.sum()).backward()
    for name, p in actor.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_ensemble_matches_independent_networks() -> None:
    """Member i of the batched critic equals a plain network holding member i's weights."""
    critic = small_critic(num_critics=3)
    with torch.no_grad():  # make scalers / biases member-specific too
        for p in critic.parameters():
            p.mul_(torch.rand_like(p) + 0.5)
    obs, act = torch.randn(10, OBS), torch.randn(10, ACT)
    q = critic(obs, act)
    for i in range(3):
        enc = SimbaV2Encoder(OBS + ACT, 32, num_blocks=2)
        head = HyperHead(32, 32, 1)
        ens_params = dict(critic.named_parameters())
        with torch.no_grad():
            for prefix, mod in (("encoder.", enc), ("head.", head)):
                for name, p in mod.named_parameters():
                    src = ens_params[prefix + name][i]
                    # Ensemble kernels are (in, out); nn.Linear is (out, in).
                    p.copy_(src.T if p.dim() == 2 else src.reshape(p.shape))
        expected = head(enc(torch.cat((obs, act), -1))).squeeze(-1)
        torch.testing.assert_close(q[i], expected)


def test_critic_fits_simple_function() -> None:
    critic = SimbaV2Critic(OBS, ACT, hidden_dim=64, num_blocks=1, num_critics=2)
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    obs, act = torch.randn(256, OBS), torch.rand(256, ACT) * 2 - 1
    target = torch.sin(2 * obs[:, 0]) + obs[:, 1] * act[:, 0] - act[:, 1] ** 2

    def loss_fn() -> torch.Tensor:
        return (critic(obs, act) - target).square().mean()

    with torch.no_grad():
        initial = loss_fn().item()
    for _ in range(150):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        normalize_weights_(critic)
    final = loss_fn().item()
    # Typically > 1000x; 50x leaves a wide margin across seeds.
    assert final < initial / 50, (initial, final)
    assert_unit_kernels(critic)
