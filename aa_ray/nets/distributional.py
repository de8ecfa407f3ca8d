"""Categorical (C51) value distributions: the fixed support, the projected Bellman target, its
clipping statistics, and ensembles of critics that output logits over the support.

References: Bellemare et al. 2017, "A Distributional Perspective on Reinforcement Learning"
(arXiv 1707.06887, Algorithm 1) for the projection; SimbaV2 (Lee et al. 2025) for the categorical
critic on SimbaV2 layers and for folding the entropy term into the target atoms.

Shapes: a support is (num_atoms,); distributions and logits are (..., num_atoms) with the batch
(and ensemble) dims in front; rewards and bootstrap factors are (batch,).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from aa_ray.nets.mlp import EnsembleMLP
from aa_ray.nets.simba import HyperHead, SimbaV2Encoder


def make_support(num_atoms: int, v_min: float, v_max: float, device: torch.device | None = None) -> Tensor:
    """The atoms z_j = v_min + j * (v_max - v_min) / (num_atoms - 1), j = 0 .. num_atoms - 1."""
    if num_atoms < 2 or not v_min < v_max:
        raise ValueError(f"a support needs num_atoms >= 2 and v_min < v_max (got {num_atoms}, {v_min}, {v_max})")
    # computed in float64 as v_min + width * j / (N - 1), so a symmetric support has an exact 0 atom
    fractions = torch.arange(num_atoms, dtype=torch.float64) / (num_atoms - 1)
    return (v_min + (v_max - v_min) * fractions).to(device=device, dtype=torch.float32)


def expected_value(logits: Tensor, support: Tensor) -> Tensor:
    """E[Z] = sum_j softmax(logits)_j z_j, in fp32; (..., num_atoms) -> (...)."""
    return (torch.softmax(logits.float(), dim=-1) * support).sum(-1)


def shifted_atoms(reward: Tensor, bootstrap: Tensor, support: Tensor) -> Tensor:
    """The Bellman-shifted atoms r + bootstrap * z_j, (batch,) x (batch,) -> (batch, num_atoms), unclipped."""
    return reward.float().unsqueeze(-1) + bootstrap.float().unsqueeze(-1) * support


def project_distribution(next_probs: Tensor, reward: Tensor, bootstrap: Tensor, support: Tensor) -> Tensor:
    """Project the distribution of r + bootstrap * Z' back onto the fixed support (C51).

    next_probs: (batch, num_atoms), the probabilities of Z' on `support`;
    reward, bootstrap: (batch,), bootstrap = discount * (1 - terminated).
    Returns (batch, num_atoms) target probabilities; each row keeps the mass of its input row.

    Each shifted atom is clipped to [v_min, v_max], then its mass is split between the two
    neighbouring atoms in proportion to closeness. The split uses floor(b) and 1 - frac(b), so an
    atom landing exactly on a support atom (floor == ceil) gives it all of its mass; the textbook
    weights (ceil - b, b - floor) are both zero there and would silently drop that mass.

    A soft (entropy-regularised) target r + bootstrap * (z_j - alpha log pi) is the same call with
    reward r - bootstrap * alpha * log pi.
    """
    num_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (num_atoms - 1)
    atoms = shifted_atoms(reward, bootstrap, support).clamp(v_min, v_max)
    position = ((atoms - v_min) / delta).clamp(0, num_atoms - 1)  # fractional index b in [0, N-1]
    lower = position.floor()
    upper_weight = position - lower  # 0 when b sits on an atom: the whole mass goes to `lower`
    lower_weight = 1.0 - upper_weight
    # lower + 1 only runs past the end when b == N-1, where upper_weight is 0: clamp the index
    upper = (lower + 1).clamp(max=num_atoms - 1)
    probs = next_probs.float()
    target = torch.zeros_like(probs)
    target.scatter_add_(-1, lower.long(), probs * lower_weight)
    target.scatter_add_(-1, upper.long(), probs * upper_weight)
    return target


def saturation(next_probs: Tensor, reward: Tensor, bootstrap: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """Share of the target mass whose shifted atom fell outside the support and was clipped:
    (below v_min, above v_max), each averaged over the batch. Mass landing exactly on an end atom
    is not counted. Persistent values well above zero mean the support is too narrow."""
    atoms = shifted_atoms(reward, bootstrap, support)
    probs = next_probs.float()
    low = (probs * (atoms < support[0])).sum(-1).mean()
    high = (probs * (atoms > support[-1])).sum(-1).mean()
    return low, high


class EnsembleCategoricalQ(EnsembleMLP):
    """`num_critics` ReLU MLPs on concat(obs, action), each with `num_atoms` logits, evaluated as one
    batched ensemble (like `EnsembleQ`, optional LayerNorm included); forward returns logits
    (num_critics, batch, num_atoms)."""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], num_atoms: int, num_critics: int = 2,
        layer_norm: bool = False,
    ):
        super().__init__(obs_dim + act_dim, hidden_dims, num_atoms, num_critics, layer_norm)
        self.num_critics = num_critics

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return super().forward(torch.cat([obs, action], dim=-1).expand(self.num_critics, -1, -1))


class SimbaV2CategoricalCritic(nn.Module):
    """`num_critics` SimbaV2 critics (hyperspherical encoder, then a HyperHead with `num_atoms`
    outputs) as one batched ensemble; forward returns logits (num_critics, batch, num_atoms).
    The head's bias starts at zero, so every critic starts at the uniform distribution."""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden_dim: int, num_blocks: int, num_atoms: int, num_critics: int = 2,
        *, c_shift: float = 3.0,
    ) -> None:
        super().__init__()
        self.num_critics = num_critics
        self.encoder = SimbaV2Encoder(obs_dim + act_dim, hidden_dim, num_blocks, c_shift, ensemble_size=num_critics)
        self.head = HyperHead(hidden_dim, hidden_dim, num_atoms, ensemble_size=num_critics)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return self.head(self.encoder(torch.cat((obs, action), dim=-1)))
