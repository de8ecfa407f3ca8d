"""SimbaV2 networks (Lee et al., ICML 2025, "Hyperspherical Normalization for Scalable Deep RL").

PyTorch re-implementation of the architecture in the official JAX code (dojeon-ai/SimbaV2,
``scale_rl/agents/simbaV2/simbaV2_layer.py`` and ``simbaV2_network.py``):

* Every weight matrix is a bias-free, orthogonally initialised :class:`HyperDense` kernel that is
  kept on the unit sphere per output unit. The optimizer does not know about that constraint, so
  the training loop must call :func:`normalize_weights_` after every optimizer step (and the
  constructors here already call it once after initialisation, as the reference does).
* Hidden activations are l2-normalised after the embedder and after every block; residual
  connections are a learnable LERP between the block input and the block output.
* Learnable per-feature :class:`Scaler` vectors restore the magnitude information that the
  normalisation removes.

Observation normalisation (running mean/std) is expected to happen *before* these modules.

Ensembles: the critic evaluates ``num_critics`` independent Q networks as one batched computation.
Every layer takes an optional ``ensemble_size``; with it, parameters carry a leading member
dimension ``E`` and activations have shape ``(E, N, features)`` (the first layer also accepts a
shared ``(N, features)`` input, which is broadcast to all members).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aa_ray.nets.mlp import bounded_log_std, ensemble_matmul

__all__ = [
    "EnsembleHyperDense",
    "HyperDense",
    "HyperHead",
    "HyperKernel",
    "HyperLERPBlock",
    "Scaler",
    "SimbaV2Actor",
    "SimbaV2Critic",
    "SimbaV2Encoder",
    "l2_normalize",
    "normalize_weights_",
]

# Same floor as the reference's ``l2normalize`` (x / max(||x||, 1e-8)); F.normalize implements
# exactly that formula.
_NORM_EPS = 1e-8

LOG_STD_MIN = -10.0
LOG_STD_MAX = 2.0


def l2_normalize(x: Tensor, dim: int = -1) -> Tensor:
    """Project ``x`` onto the unit sphere along ``dim``."""
    return F.normalize(x, p=2.0, dim=dim, eps=_NORM_EPS)


class HyperKernel:
    """Marker mixin for kernels that must stay on the unit sphere per output unit.

    :func:`normalize_weights_` re-projects exactly the modules carrying this marker; scalers and
    head biases are never touched. ``kernel_norm_dim`` is the input-feature axis of ``weight``.
    """

    weight: nn.Parameter
    kernel_norm_dim: int

    @torch.no_grad()
    def normalize_(self, where: Tensor | None = None) -> None:
        w = self.weight
        # Same x / max(||x||, eps) as l2_normalize, but via square-sum-sqrt: on CPU,
        # torch.linalg.vector_norm over a non-innermost dim (the (E, in, out) ensemble layout)
        # is ~20x slower than this.
        norm = w.square().sum(dim=self.kernel_norm_dim, keepdim=True).sqrt_().clamp_min_(_NORM_EPS)
        if where is not None:  # a skipped step leaves the (already unit) rows exactly as they were
            norm = torch.where(where, norm, torch.ones_like(norm))
        w.div_(norm)


class HyperDense(HyperKernel, nn.Linear):
    """Bias-free ``nn.Linear`` (weight ``(out, in)``) with orthogonal init and unit-norm rows."""

    kernel_norm_dim = 1

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # Gain-1 orthogonal init as flax's ``orthogonal(scale=1.0, column_axis=0)`` on the
        # [in, out] kernel. When out > in the rows are orthogonal but not unit length yet,
        # hence the projection (the reference also normalises right after init).
        nn.init.orthogonal_(self.weight)
        self.normalize_()


class EnsembleHyperDense(HyperKernel, nn.Module):
    """``ensemble_size`` independent :class:`HyperDense` kernels applied as one batched matmul.

    ``weight`` is stored as ``(E, in, out)`` (the reference's vmapped flax layout) so that the
    forward pass is ``bmm(x, W)`` and the weight gradient ``bmm(x^T, g)`` comes out in the
    parameter's own layout. With the ``nn.Linear``-style ``(E, out, in)`` layout the gradient is
    produced transposed and autograd has to copy it, which made the twin 512x2 critic ~40%
    slower than two separate networks on one CPU thread. Normalisation is along ``in`` (dim 1).
    Input: ``(N, in)`` shared by all members, or ``(E, N, in)``; output ``(E, N, out)``.
    """

    kernel_norm_dim = 1

    def __init__(self, in_features: int, out_features: int, ensemble_size: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.ensemble_size = ensemble_size
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_features, out_features))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # Each member is initialised independently, like flax's nn.vmap with split rngs.
        tmp = torch.empty(self.out_features, self.in_features)
        for member in self.weight:
            nn.init.orthogonal_(tmp)
            member.copy_(tmp.T)
        self.normalize_()

    def forward(self, x: Tensor) -> Tensor:
        return ensemble_matmul(x, self.weight)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"ensemble_size={self.ensemble_size}"
        )


def _hyper_dense(
    in_features: int, out_features: int, ensemble_size: int | None
) -> HyperDense | EnsembleHyperDense:
    if ensemble_size is None:
        return HyperDense(in_features, out_features)
    return EnsembleHyperDense(in_features, out_features, ensemble_size)


class Scaler(nn.Module):
    """Learnable per-feature scale, ``x * param * (init / scale)``.

    The parameter is stored at ``scale`` and multiplied by the constant ``init / scale`` so the
    effective value starts at ``init``. Keeping the stored value small (e.g. ``sqrt(2/d)``) while
    the effective value is larger changes the effective learning rate of the scaler under Adam,
    which is how the reference tunes it; storing ``init`` directly would not be equivalent.
    """

    def __init__(
        self,
        dim: int,
        init: float = 1.0,
        scale: float = 1.0,
        ensemble_size: int | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.init = init
        self.scale = scale
        self.forward_scale = init / scale
        # Ensemble parameters are (E, 1, dim) so they broadcast over (E, N, dim) activations.
        shape: tuple[int, ...] = (dim,) if ensemble_size is None else (ensemble_size, 1, dim)
        self.scaler = nn.Parameter(torch.full(shape, float(scale)))

    def effective(self) -> Tensor:
        """The multiplier actually applied in ``forward``."""
        return self.scaler * self.forward_scale

    def forward(self, x: Tensor) -> Tensor:
        # Scale the (small) parameter first so only one full-size multiply touches ``x``.
        return x * self.effective()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, init={self.init:.4g}, scale={self.scale:.4g}"


class HyperLERPBlock(nn.Module):
    """Residual block: ``h <- l2(lerp(h, l2(W2(ReLU(s * W1 h) + eps)), alpha))``.

    ``W1`` expands to ``expansion * dim`` features. Its scaler uses the reference's values
    divided by ``sqrt(expansion)``, i.e. ``sqrt(2 / (expansion * dim))`` for the defaults.
    """

    def __init__(
        self,
        dim: int,
        scaler_init: float,
        scaler_scale: float,
        alpha_init: float,
        alpha_scale: float,
        expansion: int = 4,
        ensemble_size: int | None = None,
    ) -> None:
        super().__init__()
        inner = dim * expansion
        self.w1 = _hyper_dense(dim, inner, ensemble_size)
        self.scaler = Scaler(
            inner,
            scaler_init / math.sqrt(expansion),
            scaler_scale / math.sqrt(expansion),
            ensemble_size,
        )
        self.w2 = _hyper_dense(inner, dim, ensemble_size)
        self.alpha = Scaler(dim, alpha_init, alpha_scale, ensemble_size)

    def forward(self, h: Tensor) -> Tensor:
        # The +eps keeps the input of W2 from being all zeros (dead ReLUs), which would make the
        # following l2-normalisation divide by zero.
        u = F.relu(self.scaler(self.w1(h)), inplace=True) + _NORM_EPS
        h_new = l2_normalize(self.w2(u))
        # lerp(h, h_new, a) == h + a * (h_new - h), fused into one kernel.
        # (under autocast h may be bf16 while the scaler is fp32; lerp wants one dtype)
        return l2_normalize(torch.lerp(h, h_new.to(h.dtype), self.alpha.effective().to(h.dtype)))


class HyperHead(nn.Module):
    """Output head ``W2(s * W1 z) + b`` with no activation in between.

    Both kernels are :class:`HyperDense` and get re-projected (the reference normalises every
    ``hyper_dense`` kernel, predictor included); the bias is a separate, unconstrained parameter.
    ``out_dim`` is free so the same head serves scalar Q (1), a categorical critic (num bins) and
    the policy's mean / log-std (action dim). The scaler starts at 1 as in the reference heads.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        ensemble_size: int | None = None,
    ) -> None:
        super().__init__()
        self.w1 = _hyper_dense(in_dim, hidden_dim, ensemble_size)
        self.scaler = Scaler(hidden_dim, 1.0, 1.0, ensemble_size)
        self.w2 = _hyper_dense(hidden_dim, out_dim, ensemble_size)
        shape: tuple[int, ...] = (
            (out_dim,) if ensemble_size is None else (ensemble_size, 1, out_dim)
        )
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, z: Tensor) -> Tensor:
        return self.w2(self.scaler(self.w1(z))) + self.bias


class SimbaV2Encoder(nn.Module):
    """Embedder plus ``num_blocks`` LERP blocks; returns unit-norm features.

    Without ``ensemble_size``: ``(..., in_dim) -> (..., hidden_dim)``.
    With ``ensemble_size=E``: ``(N, in_dim)`` (shared by all members) or ``(E, N, in_dim)``
    ``-> (E, N, hidden_dim)``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        num_blocks: int,
        c_shift: float = 3.0,
        *,
        ensemble_size: int | None = None,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.hidden_dim = hidden_dim
        self.c_shift = c_shift
        # Defaults of configs/agent/simbaV2.yaml.
        scaler_init = scaler_scale = math.sqrt(2.0 / hidden_dim)
        alpha_init = 1.0 / (num_blocks + 1)
        alpha_scale = 1.0 / math.sqrt(hidden_dim)
        self.embed = _hyper_dense(in_dim + 1, hidden_dim, ensemble_size)
        self.embed_scaler = Scaler(hidden_dim, scaler_init, scaler_scale, ensemble_size)
        self.blocks = nn.ModuleList(
            HyperLERPBlock(
                hidden_dim,
                scaler_init,
                scaler_scale,
                alpha_init,
                alpha_scale,
                ensemble_size=ensemble_size,
            )
            for _ in range(num_blocks)
        )

    def forward(self, x: Tensor) -> Tensor:
        # The constant feature keeps the input's norm (its magnitude) recoverable after the
        # projection onto the sphere, which would otherwise discard it.
        shift = torch.full_like(x[..., :1], self.c_shift)
        x = l2_normalize(torch.cat((x, shift), dim=-1))
        h = l2_normalize(self.embed_scaler(self.embed(x)))
        for block in self.blocks:
            h = block(h)
        return h


class SimbaV2Actor(nn.Module):
    """Tanh-Gaussian policy network; returns pre-tanh ``(mean, log_std)``.

    ``log_std`` is squashed smoothly into ``[LOG_STD_MIN, LOG_STD_MAX] = [-10, 2]`` with a tanh
    rather than clipped, so it keeps a gradient everywhere.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden_dim: int = 128,
        num_blocks: int = 1,
        *,
        c_shift: float = 3.0,
    ) -> None:
        super().__init__()
        self.encoder = SimbaV2Encoder(obs_dim, hidden_dim, num_blocks, c_shift)
        # Separate heads (own W1) for mean and log-std, as in HyperNormalTanhPolicy.
        self.mean_head = HyperHead(hidden_dim, hidden_dim, act_dim)
        self.log_std_head = HyperHead(hidden_dim, hidden_dim, act_dim)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        z = self.encoder(obs)
        mean = self.mean_head(z)
        return mean, bounded_log_std(self.log_std_head(z), LOG_STD_MIN, LOG_STD_MAX)


class SimbaV2Critic(nn.Module):
    """`num_critics` independent Q networks evaluated as one batched ensemble.

    Input is ``concat(obs, action)``; output is ``(num_critics, *batch)`` scalar Q values. Each
    member has its own (independently initialised) encoder and head, exactly like the reference's
    ``nn.vmap`` over ``SimbaV2Critic`` with ``split_rngs={"params": True}``.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden_dim: int = 512,
        num_blocks: int = 2,
        num_critics: int = 2,
        *,
        c_shift: float = 3.0,
    ) -> None:
        super().__init__()
        self.num_critics = num_critics
        self.encoder = SimbaV2Encoder(
            obs_dim + act_dim, hidden_dim, num_blocks, c_shift, ensemble_size=num_critics
        )
        self.head = HyperHead(hidden_dim, hidden_dim, 1, ensemble_size=num_critics)

    def features(self, obs: Tensor, action: Tensor) -> Tensor:
        """Unit-norm encoder features, ``(num_critics, N, hidden_dim)`` with N = prod(batch)."""
        x = torch.cat((obs, action), dim=-1)
        return self.encoder(x.reshape(-1, x.shape[-1]))

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        batch_shape = obs.shape[:-1]
        q = self.head(self.features(obs, action)).squeeze(-1)
        return q.reshape(self.num_critics, *batch_shape)


class SimbaV2Value(nn.Module):
    """State value V(s) with the critic's architecture (one member); output ``(*batch)``."""

    def __init__(self, obs_dim: int, hidden_dim: int = 512, num_blocks: int = 2, *, c_shift: float = 3.0) -> None:
        super().__init__()
        self.encoder = SimbaV2Encoder(obs_dim, hidden_dim, num_blocks, c_shift)
        self.head = HyperHead(hidden_dim, hidden_dim, 1)

    def forward(self, obs: Tensor) -> Tensor:
        return self.head(self.encoder(obs)).squeeze(-1)


@torch.no_grad()
def normalize_weights_(module: nn.Module, where: Tensor | None = None) -> None:
    """Re-project every HyperDense kernel in `module` onto the unit sphere (only if `where`, a
    device bool, holds: the gradient step passes whether it stepped).

    Call after EVERY optimizer step (and after any manual weight surgery). Each output unit's
    weight vector (each row of ``weight``, per ensemble member) gets unit l2 norm. Scalers and
    head biases are left alone, as in the reference (which only touches ``hyper_dense`` params).
    """
    for m in module.modules():
        if isinstance(m, HyperKernel):
            m.normalize_(where)
