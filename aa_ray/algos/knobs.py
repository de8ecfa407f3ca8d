"""Knobs shared by the off-policy family: the config fields every variant has, and the small
pieces that implement them (loss choice, one gradient step with clipping and mixed precision,
optimizer choice, reward normalization). Algorithm files call these; none subclasses another."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray.spec.base import SpecModel


class OffPolicyConfig(SpecModel):
    """Fields every off-policy variant shares (a config base; the algorithm classes share nothing)."""

    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    n_step: PositiveInt = Field(1, description="n-step returns (1 = one-step TD)")
    tau: float = Field(0.005, gt=0, le=1, description="polyak rate of the target networks")
    batch_size: PositiveInt = Field(256, description="transitions per gradient step")
    buffer_size: PositiveInt = Field(1_000_000, description="replay capacity in transitions")
    warm_up_steps: NonNegativeInt = Field(5000, description="uniform random actions until this many are stored")
    train_every: PositiveInt = Field(32, description="fleet steps collected between learner iterations")
    utd_ratio: PositiveInt = Field(1, description="critic updates per fleet step")
    normalize_obs: bool = Field(False, description="running mean/std observation normalization")
    normalize_reward: bool = Field(False, description="scale rewards by the running std of the return")
    critic_loss: Literal["mse", "huber"] = Field("mse", description="TD regression loss (scalar critics)")
    huber_delta: PositiveFloat = Field(1.0, description="Huber threshold when critic_loss is huber")
    max_grad_norm: PositiveFloat | None = Field(None, description="clip gradients to this global norm")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="autocast dtype (losses in fp32)")
    optimizer: Literal["adam", "muon"] = Field("adam", description="muon: Muon for hidden matrices, AdamW else")
    prior_data: str | None = Field(None, description="RLPD: a transition dataset (Parquet) to mix in")
    prior_data_ratio: float = Field(0.5, ge=0, lt=1, description="RLPD: share of each batch from prior_data")

    @model_validator(mode="after")
    def _muon_available(self) -> OffPolicyConfig:
        if self.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
            raise ValueError(
                f"optimizer: muon needs torch.optim.Muon, which torch {torch.__version__} lacks; "
                "use optimizer: adam or a newer torch"
            )
        if self.optimizer == "muon" and self.precision == "fp16":
            raise ValueError("optimizer: muon cannot be combined with precision fp16 (loss scaling); use bf16")
        return self


def prior_rows(batch_size: int, ratio: float) -> int:
    """RLPD: how many of a batch's rows come from the prior dataset (they come first)."""
    return round(ratio * batch_size)


def prior_q_gap(q: Tensor, cfg: OffPolicyConfig) -> dict[str, float]:
    """RLPD diagnostics: mean Q on the prior rows vs the online rows of a batch (q: (..., batch))."""
    if cfg.prior_data is None:
        return {}
    n = prior_rows(q.shape[-1], cfg.prior_data_ratio)
    prior, online = q[..., :n].mean().item(), q[..., n:].mean().item()
    return {"critic/prior_q": prior, "critic/online_q": online, "critic/prior_online_q_gap": prior - online}


def td_loss(prediction: Tensor, target: Tensor, kind: str, huber_delta: float) -> Tensor:
    """Per-critic mean TD loss in fp32, summed over the ensemble dim (dim 0)."""
    prediction, target = prediction.float(), target.float().expand_as(prediction)
    if kind == "huber":
        per_element = nn.functional.huber_loss(prediction, target, reduction="none", delta=huber_delta)
    else:
        per_element = (prediction - target).pow(2)
    return per_element.mean(dim=-1).sum()


def expectile_loss(prediction: Tensor, target: Tensor, expectile: float) -> Tensor:
    """Asymmetric squared error: under-predictions weigh `expectile`, over-predictions 1 - expectile,
    so the minimiser is the `expectile`-expectile of the target (0.5: the mean)."""
    err = target - prediction
    weight = torch.where(err >= 0, expectile, 1.0 - expectile)
    return (weight * err.pow(2)).mean()


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


class GradientStep:
    """zero_grad -> backward (loss-scaled under fp16) -> unscale -> norm/clip -> step.

    Returns the global gradient norm (before clipping); the norm is measured on unscaled
    gradients, which is the only place it means anything under fp16.

    A step whose loss or gradients are not finite is skipped (the parameters and optimizer state
    stay as they were) and counted in `skipped`; `consecutive_skips` says how many in a row. The
    check runs after the gradient all-reduce, so all learners skip the same steps. Under fp16 the
    grad scaler's own inf/nan skips (loss-scale calibration) are left to it.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,  # a MuonWithAdamW is accepted too; the config refuses it with fp16
        max_grad_norm: float | None,
        precision: str,
        device: torch.device,
        average_grads: bool = False,  # for tensors outside DDP modules (SAC's log-temperature)
    ):
        self.optimizer = optimizer
        self.average_grads = average_grads
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.max_grad_norm = max_grad_norm
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.skipped = 0
        self.consecutive_skips = 0

    def __call__(self, loss: Tensor, measure: bool = False) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
        if self.average_grads:
            ddp.average_grads_(self.params)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = float(nn.utils.get_total_norm(grads)) if grads else 0.0
        if self.scaler is None and not (math.isfinite(norm) and torch.isfinite(loss.detach())):
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            self.consecutive_skips += 1
            return norm
        self.consecutive_skips = 0
        if self.max_grad_norm is not None:
            nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, torch.tensor(norm))
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return norm

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def make_optimizer(module: nn.Module, kind: str, lr: float) -> torch.optim.Optimizer:
    """Adam for everything, or Muon for the hidden weight matrices and AdamW for the rest
    (embeddings, heads, biases, gains), as the Muon authors recommend."""
    params = [p for p in module.parameters() if p.requires_grad]
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, fused=True)
    matrices = _hidden_matrices(module)
    ids = {id(p) for p in matrices}
    rest = [p for p in params if id(p) not in ids]
    if not matrices:  # e.g. an ensemble's stacked (members, in, out) weights: torch's Muon takes 2-D only
        return torch.optim.AdamW(rest, lr=lr)
    return MuonWithAdamW(torch.optim.Muon(matrices, lr=lr), torch.optim.AdamW(rest, lr=lr))


def _hidden_matrices(module: nn.Module) -> list[Tensor]:
    """2-D weights that are neither the first nor the last layer of the module."""
    matrices = [p for name, p in module.named_parameters() if p.ndim == 2 and "weight" in name and p.requires_grad]
    return matrices[1:-1]


class MuonWithAdamW:
    """Muon and AdamW stepping together, so algorithm code sees one optimizer."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.parts = (muon, adamw)
        self.param_groups = muon.param_groups + adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def state_dict(self) -> dict:
        return {"muon": self.parts[0].state_dict(), "adamw": self.parts[1].state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.parts[0].load_state_dict(state["muon"])
        self.parts[1].load_state_dict(state["adamw"])


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
        self.max_abs.copy_(torch.maximum(self.max_abs, torch.tensor(max_abs, dtype=torch.float64)))

    def scale(self) -> float:
        if not self.enabled or self.count == 0:
            return 1.0
        denominator = float(torch.sqrt(self.var + self.eps))
        if self.v_max is not None:
            denominator = max(denominator, float(self.max_abs) / self.v_max)
        return 1.0 / max(denominator, self.eps)

    def forward(self, reward: Tensor) -> Tensor:
        return reward * self.scale()


def return_moments(returns: Iterable[float]) -> tuple[int, float, float, float]:
    values = np.asarray(list(returns), np.float64)
    if values.size == 0:
        return 0, 0.0, 1.0, 0.0
    return int(values.size), float(values.mean()), float(values.var()), float(np.abs(values).max())
