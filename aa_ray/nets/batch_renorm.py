"""Batch renormalization (Ioffe 2017, "Batch Renormalization: Towards Reducing Minibatch
Dependence in Batch-Normalized Models") and the CrossQ networks built with it (Bhatt et al. 2024).

In training mode a layer normalizes by the batch's statistics, corrected toward the running ones:
y = ((x - mu_B) / sigma_B * r + d) * gain + bias with r = clip(sigma_B / sigma, 1/r_max, r_max) and
d = clip((mu_B - mu) / sigma, -d_max, d_max), both without gradient; r = 1 and d = 0 (plain batch
normalization) for the first `warmup_steps` forward passes, while the running statistics settle.
In evaluation mode it normalizes by the running statistics alone: env runners, evaluation and
exported policies act in evaluation mode (aa_ray.runtime.env_runner), the learner trains in
training mode and switches a module to evaluation mode where the algorithm says so.

The batch statistics come from `ddp.batch_moments`: with several learners they are the global
batch's, so every learner normalizes alike and their running statistics stay equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray.nets.mlp import EnsembleLinear, bounded_log_std


class RenormSettings(NamedTuple):
    momentum: float = 0.01  # running <- running + momentum * (batch - running)
    warmup_steps: int = 100_000  # forward passes of plain batch normalization first
    r_max: float = 3.0
    d_max: float = 5.0
    eps: float = 1e-3


class BatchRenorm(nn.Module):
    """Batch renormalization over the batch dim (-2) of (batch, features) or (members, batch,
    features) inputs; with `members`, each ensemble member has its own statistics and affine."""

    def __init__(self, features: int, settings: RenormSettings, members: int | None = None):
        super().__init__()
        self.settings = settings
        shape = (features,) if members is None else (members, 1, features)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        s = self.settings
        if not self.training:
            return (x - self.running_mean) * torch.rsqrt(self.running_var + s.eps) * self.weight + self.bias
        mean, var = ddp.batch_moments(x, dim=-2)
        if x.dim() == 2:  # (batch, features): statistics of the running ones' shape (features,)
            mean, var = mean.squeeze(0), var.squeeze(0)
        std = torch.sqrt(var + s.eps)
        with torch.no_grad():
            running_std = torch.sqrt(self.running_var + s.eps)
            warmed_up = self.steps >= s.warmup_steps
            r = torch.where(warmed_up, (std / running_std).clamp(1.0 / s.r_max, s.r_max), 1.0)
            d = torch.where(warmed_up, ((mean - self.running_mean) / running_std).clamp(-s.d_max, s.d_max), 0.0)
            # the running statistics stay fp32 when the layers run in bf16 (autocast)
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), s.momentum)
            self.running_var.lerp_(var.detach().to(self.running_var.dtype), s.momentum)
            self.steps += 1
        return ((x - mean) / std * r + d) * self.weight + self.bias


class RenormActor(nn.Module):
    """CrossQ's actor: batch renormalization on the input and after every hidden ReLU layer, then
    the Gaussian head (pre-tanh mean and a bounded log-std, as `MLPActor`)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], settings: RenormSettings):
        super().__init__()
        layers: list[nn.Module] = [BatchRenorm(obs_dim, settings)]
        for width in hidden_dims:
            layers += [nn.Linear(obs_dim, width), nn.ReLU(), BatchRenorm(width, settings)]
            obs_dim = width
        self.net = nn.Sequential(*layers, nn.Linear(obs_dim, 2 * act_dim))

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean, raw_log_std = self.net(obs).chunk(2, dim=-1)
        return mean, bounded_log_std(raw_log_std)


class RenormEnsembleQ(nn.Module):
    """CrossQ's critics: `num_critics` Q(s, a) MLPs as one batched ensemble, batch renormalization
    on the input and after every hidden ReLU layer; forward returns (num_critics, batch)."""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], settings: RenormSettings, num_critics: int = 2
    ):
        super().__init__()
        in_dim = obs_dim + act_dim
        layers: list[nn.Module] = [BatchRenorm(in_dim, settings, num_critics)]
        for width in hidden_dims:
            layers += [EnsembleLinear(num_critics, in_dim, width), nn.ReLU(), BatchRenorm(width, settings, num_critics)]
            in_dim = width
        self.net = nn.Sequential(*layers, EnsembleLinear(num_critics, in_dim, 1))
        self.num_critics = num_critics

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([obs, action], dim=-1).expand(self.num_critics, -1, -1)).squeeze(-1)
