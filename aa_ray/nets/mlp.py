"""Plain MLP actor and an ensemble of Q networks evaluated as one batched computation."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def mlp(in_dim: int, hidden_dims: Sequence[int], out_dim: int) -> nn.Sequential:
    """Linear-ReLU layers of the given widths, then a linear output layer."""
    layers: list[nn.Module] = []
    for width in hidden_dims:
        # in place: the linear layer's output is not needed again, and one activation-sized write
        # fewer per layer counts on a CPU, where these element-wise passes are bound by memory
        layers += [nn.Linear(in_dim, width), nn.ReLU(inplace=True)]
        in_dim = width
    return nn.Sequential(*layers, nn.Linear(in_dim, out_dim))


def bounded_log_std(raw_log_std: Tensor, low: float = LOG_STD_MIN, high: float = LOG_STD_MAX) -> Tensor:
    """A Gaussian head's log-std squashed into [low, high]: tanh keeps it bounded with a gradient
    everywhere (a clamp has none outside)."""
    return low + 0.5 * (high - low) * (torch.tanh(raw_log_std) + 1)


class MLPActor(nn.Module):
    """Gaussian head over a ReLU MLP: returns the pre-tanh mean and a bounded log-std."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int]):
        super().__init__()
        self.net = mlp(obs_dim, hidden_dims, 2 * act_dim)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean, raw_log_std = self.net(obs).chunk(2, dim=-1)
        return mean, bounded_log_std(raw_log_std)


def ensemble_matmul(x: Tensor, weight: Tensor) -> Tensor:
    """x @ weight per ensemble member, (members or none, batch, in) x (members, in, out).

    A one-column product (a scalar head) is a broadcast multiply and a sum: the batched matmul
    kernels are far slower at width 1 on a CPU, above all in the backward pass, where the input's
    gradient becomes an outer product with an inner dimension of 1."""
    if weight.shape[-1] == 1:
        return (x * weight.transpose(-1, -2)).sum(-1, keepdim=True)
    return torch.matmul(x, weight)


class EnsembleLinear(nn.Module):
    """`num_members` independent linear layers applied with one batched matmul."""

    def __init__(self, num_members: int, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_members, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_dim))
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default init, per member
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:  # x: (members, batch, in_dim)
        if self.weight.shape[-1] == 1:
            return ensemble_matmul(x, self.weight) + self.bias
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over features with a separate gain and bias per ensemble member."""

    def __init__(self, num_members: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_members, 1, width))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, width))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x, x.shape[-1:]) * self.weight + self.bias


class SeededDropout(nn.Module):
    """Dropout whose masks come from `generator` (nn.Dropout draws from torch's global one): a
    learner's dropout masks follow from its seed and resume with its checkpointed generator."""

    def __init__(self, p: float, generator: torch.Generator):
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.generator)
        return x * keep / (1.0 - self.p)


class EnsembleMLP(nn.Module):
    """`num_members` ReLU MLPs of the same widths as one batched ensemble, (members, batch, in) ->
    (members, batch, out). `layer_norm` adds LayerNorm after each hidden layer, which RLPD found
    keeps Q values bounded when training on offline data the policy never visits; `dropout` drops
    each hidden unit in training mode, before the LayerNorm (DroQ)."""

    def __init__(
        self, in_dim: int, hidden_dims: Sequence[int], out_dim: int, num_members: int, layer_norm: bool = False,
        dropout: SeededDropout | None = None,
    ):
        super().__init__()
        dims = [in_dim, *hidden_dims, out_dim]
        self.layers = nn.ModuleList(
            EnsembleLinear(num_members, d_in, d_out) for d_in, d_out in zip(dims[:-1], dims[1:], strict=True)
        )
        self.norms = nn.ModuleList(
            EnsembleLayerNorm(num_members, width) if layer_norm else nn.Identity() for width in hidden_dims
        )
        self.dropout = dropout or nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        for layer, norm in zip(self.layers[:-1], self.norms, strict=True):
            x = torch.relu_(norm(self.dropout(layer(x))))  # in place, as in `mlp`
        return self.layers[-1](x)


class EnsembleQ(EnsembleMLP):
    """`num_critics` Q(s, a) MLPs; forward returns Q values of shape (num_critics, batch)."""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], num_critics: int = 2, layer_norm: bool = False,
        dropout: SeededDropout | None = None,
    ):
        super().__init__(obs_dim + act_dim, hidden_dims, 1, num_critics, layer_norm, dropout)
        self.num_critics = num_critics

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return super().forward(torch.cat([obs, action], dim=-1).expand(self.num_critics, -1, -1)).squeeze(-1)


class MLPValue(nn.Module):
    """V(s): a ReLU MLP with a scalar output, shape (batch,)."""

    def __init__(self, obs_dim: int, hidden_dims: Sequence[int]):
        super().__init__()
        self.net = mlp(obs_dim, hidden_dims, 1)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs).squeeze(-1)
