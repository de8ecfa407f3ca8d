"""Reward normalization by the running scale of the return (observation normalization lives with the
policy that reads it, `aa_ray.nets.policy`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RewardNormalizer(nn.Module):
    """Scales rewards by the running standard deviation of the discounted return.

    Env runners track each env's return G <- gamma * (1 - done) * G + r on raw rewards and send
    its moments; the learner merges them here between updates. With `v_max` set (SimbaV2), the
    scale is max(std(G), max|G| / v_max) so returns fit a support of half-width v_max.
    """

    def __init__(self, enabled: bool, v_max: float | None = None, eps: float = 1e-8):
        super().__init__()
        self.enabled, self.v_max, self.eps = enabled, v_max, eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("max_abs", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def merge(self, count: float, mean: float, var: float, max_abs: float) -> None:
        if not self.enabled or count <= 0:
            return
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta**2 * self.count * count / total
        self.mean += delta * count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        self.max_abs.copy_(torch.maximum(self.max_abs, torch.as_tensor(max_abs, dtype=torch.float64)))

    def scale(self) -> Tensor:
        """The factor rewards are multiplied by (a float32 scalar on the buffers' device; 1 until stats arrive)."""
        if not self.enabled:
            return torch.ones((), device=self.var.device)
        denominator = torch.sqrt(self.var + self.eps)
        if self.v_max is not None:
            denominator = torch.maximum(denominator, self.max_abs / self.v_max)
        scale = 1.0 / denominator.clamp_min(self.eps)
        return torch.where(self.count > 0, scale, torch.ones_like(scale)).float()

    def forward(self, reward: Tensor) -> Tensor:
        return reward * self.scale()
