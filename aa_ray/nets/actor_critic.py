"""PPO's networks: a Gaussian actor with a state-independent log-std and a value critic, behind one
observation normalizer. The whole module is what env runners load: they act *and* compute the
values that GAE needs, so the learner gets complete rollouts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from aa_ray.nets.policy import Array, ObsNormalizer, acting_input, actor_input, as_given
from aa_ray.records import ObsDims

ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU}


def orthogonal_mlp(in_dim: int, hidden_dims: Sequence[int], out_dim: int, out_gain: float,
                   activation: str = "tanh") -> nn.Sequential:
    """MLP with orthogonal init (gain sqrt 2 inside, `out_gain` on the output layer), the
    initialization PPO implementations share; a small output gain starts the actor near mean 0."""
    layers: list[nn.Module] = []
    for width in hidden_dims:
        layers += [_orthogonal(nn.Linear(in_dim, width), math.sqrt(2.0)), ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers, _orthogonal(nn.Linear(in_dim, out_dim), out_gain))


def _orthogonal(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class GaussianActor(nn.Module):
    """pi(a|s) = N(mean(s), diag(exp(log_std))^2) over unbounded actions; runners clip them to the
    policy's `action_limit` ([-1, 1] unless the spec leaves them unclipped)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], init_log_std: float,
                 activation: str = "tanh"):
        super().__init__()
        self.mean = orthogonal_mlp(obs_dim, hidden_dims, act_dim, out_gain=0.01, activation=activation)
        self.log_std = nn.Parameter(torch.full((act_dim,), init_log_std))

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log pi(action|obs) and the entropy, both summed over action dims, and the mean action (obs
        are normalized; the mean is for the symmetry loss, inside the same DDP forward)."""
        distribution = self.distribution(obs)
        return distribution.log_prob(action).sum(-1), distribution.entropy().sum(-1), distribution.mean

    def distribution(self, obs: Tensor) -> torch.distributions.Normal:
        mean = self.mean(obs)
        # no argument validation: it reads the parameters on the host, a device sync per minibatch
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean), validate_args=False)


class ValueCritic(nn.Module):
    def __init__(self, obs_dim: int, hidden_dims: Sequence[int], activation: str = "tanh"):
        super().__init__()
        self.net = orthogonal_mlp(obs_dim, hidden_dims, 1, out_gain=1.0, activation=activation)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs).squeeze(-1)


class GaussianActorCritic(nn.Module):
    """normalizer -> (actor, critic). Methods take raw observations."""

    def __init__(
        self, obs: ObsDims, act_dim: int, actor_hidden_dims: Sequence[int], critic_hidden_dims: Sequence[int],
        normalize_obs: bool, init_log_std: float = 0.0, activation: str = "tanh", clip_actions: bool = True,
    ):
        super().__init__()
        # where the actions the env takes end: [-1, 1] (the env's bounds), or nowhere (bounds as a scale)
        self.action_limit = 1.0 if clip_actions else float("inf")
        self.obs_norm = ObsNormalizer(obs.full, enabled=normalize_obs)
        # the actor reads the leading obs.actor features
        self.actor = GaussianActor(obs.actor, act_dim, actor_hidden_dims, init_log_std, activation)
        self.critic = ValueCritic(obs.full, critic_hidden_dims, activation)
        self.actor_features = obs.actor

    @torch.no_grad()
    def explore(self, obs: Array, generator: torch.Generator) -> tuple[Array, Array]:
        """A sampled (unclipped) action and its log-probability, for on-policy rollouts (numpy or
        tensors, as the observations came: `as_given`)."""
        obs_t = acting_input(obs)
        distribution = self.actor.distribution(actor_input(self.obs_norm, obs_t, self.actor_features))
        noise = torch.randn(distribution.mean.shape, generator=generator, device=obs_t.device)
        action = distribution.mean + distribution.stddev * noise
        return as_given(action, obs), as_given(distribution.log_prob(action).sum(-1), obs)

    @torch.no_grad()
    def value(self, obs: Array) -> Array:
        return as_given(self.critic(self.obs_norm(acting_input(obs))), obs)

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The mean action within the action limit, for raw observations (evaluation, exported policies)."""
        mean = self.actor.mean(actor_input(self.obs_norm, obs, self.actor_features))
        return mean.clamp(-self.action_limit, self.action_limit)

    @torch.no_grad()
    def act(self, obs: Array, deterministic: bool, generator: torch.Generator | None = None) -> Array:
        """Actions within the action limit (evaluation and recorded datasets): the mean, or a clipped sample."""
        obs_t = acting_input(obs)
        if deterministic:
            return as_given(self.deterministic_action(obs_t), obs)
        distribution = self.actor.distribution(actor_input(self.obs_norm, obs_t, self.actor_features))
        noise = torch.randn(distribution.mean.shape, generator=generator, device=obs_t.device)
        sample = distribution.mean + distribution.stddev * noise
        return as_given(sample.clamp(-self.action_limit, self.action_limit), obs)
