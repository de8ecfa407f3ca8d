"""What env runners act with for deterministic-actor algorithms (TD3): an observation normalizer
in front of an actor whose output is squashed by tanh, plus Gaussian exploration noise at acting time."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aa_ray.nets.policy import Array, ObsNormalizer, acting_input, actor_input, as_given
from aa_ray.records import ObsDims


class DeterministicPolicy(nn.Module):
    """normalizer -> actor (pre-tanh action) -> tanh; actions in [-1, 1].

    Acting adds N(0, exploration_noise^2) to the action and clips to [-1, 1] (TD3's exploration);
    deterministic acting (evaluation) does not. The noise scale is a plain attribute, not state:
    it comes from the config, so a checkpoint's policy weights carry no copy of it.
    """

    def __init__(self, actor: nn.Module, obs: ObsDims, normalize_obs: bool, exploration_noise: float):
        super().__init__()
        self.obs_norm = ObsNormalizer(obs.full, enabled=normalize_obs)
        self.actor = actor  # the leading obs.actor features (normalized) -> pre-tanh action
        self.actor_features = obs.actor
        self.exploration_noise = exploration_noise

    def forward(self, obs: Tensor) -> Tensor:
        """The policy's action for raw observations, differentiable, for training."""
        return torch.tanh(self.actor(actor_input(self.obs_norm, obs, self.actor_features)))

    def deterministic_action(self, obs: Tensor) -> Tensor:
        return self(obs)

    @torch.no_grad()
    def act(self, obs: Array, deterministic: bool, generator: torch.Generator | None = None) -> Array:
        """Actions in [-1, 1] for raw observations, numpy or a tensor (`as_given`)."""
        action = self(acting_input(obs))
        if deterministic or self.exploration_noise == 0:
            return as_given(action, obs)
        noise = torch.randn(action.shape, generator=generator, dtype=action.dtype, device=action.device)
        return as_given((action + self.exploration_noise * noise).clamp(-1.0, 1.0), obs)
