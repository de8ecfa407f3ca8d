"""Math pieces against references: tanh-Gaussian log-prob, normalizer merge, polyak, ensemble critic."""

from __future__ import annotations

import numpy as np
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from aa_ray.algos.gradient_step import polyak_update_
from aa_ray.nets.mlp import EnsembleQ
from aa_ray.nets.policy import ObsNormalizer, squashed_gaussian_sample


def test_squashed_gaussian_log_prob_matches_torch_distributions() -> None:
    torch.manual_seed(0)
    mean, log_std = torch.randn(64, 3), torch.randn(64, 3).clamp(-2, 1)
    noise = torch.randn(mean.shape, generator=torch.Generator().manual_seed(1))
    action, log_prob = squashed_gaussian_sample(mean, log_std, noise)
    # the same noise, in float64, through torch's own tanh-transformed Normal
    noise = noise.double()
    base = Normal(mean.double(), log_std.double().exp())
    pre_tanh = base.loc + base.scale * noise
    expected = TransformedDistribution(base, [TanhTransform(cache_size=1)]).log_prob(torch.tanh(pre_tanh)).sum(-1)
    # torch's own log_prob inverts tanh, which loses precision near |a| = 1: compare away from it
    ok = torch.tanh(pre_tanh).abs().amax(-1) < 0.999
    torch.testing.assert_close(action.double(), torch.tanh(pre_tanh), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(log_prob.double()[ok], expected[ok], rtol=1e-4, atol=1e-4)
    assert ok.sum() > 40


def test_normalizer_merge_equals_moments_of_all_data() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 100, 37)]
    norm = ObsNormalizer(4, enabled=True)
    for chunk in chunks:
        norm.merge(len(chunk), chunk.mean(0), chunk.var(0))
    everything = np.concatenate(chunks)
    np.testing.assert_allclose(norm.mean.numpy(), everything.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), everything.var(0), rtol=1e-10)
    assert float(norm.count) == len(everything)


def test_disabled_normalizer_is_identity() -> None:
    norm = ObsNormalizer(2, enabled=False)
    norm.merge(3, np.ones(2), np.ones(2))
    x = torch.randn(5, 2)
    assert torch.equal(norm(x), x)


def test_polyak_moves_target_by_tau() -> None:
    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = target.weight.detach().clone()
    polyak_update_(online, target, tau=0.25)
    torch.testing.assert_close(target.weight, 0.75 * before + 0.25 * online.weight.detach())


def test_ensemble_members_are_independent_networks() -> None:
    torch.manual_seed(0)
    critic = EnsembleQ(obs_dim=3, act_dim=2, hidden_dims=[8, 8], num_critics=2)
    obs, act = torch.randn(5, 3), torch.randn(5, 2)
    q = critic(obs, act)
    assert q.shape == (2, 5)
    assert not torch.allclose(q[0], q[1])
    # the gradient of member 0's output reaches only member 0's weights
    q[0].sum().backward()
    assert critic.layers[0].weight.grad[1].abs().sum() == 0
    assert critic.layers[0].weight.grad[0].abs().sum() > 0
