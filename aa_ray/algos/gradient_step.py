"""One gradient step of a network (clipping, mixed precision, the finite-step guard that skips on
the device) and the slow targets' polyak step: how an update moves parameters."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray.algos.optimizers import MuonWithAdamW, tensor_lrs_
from aa_ray.algos.precision import resolve_precision


class GradientStep:
    """zero_grad -> backward (loss-scaled under fp16) -> unscale -> norm/clip -> step.

    Returns the global gradient norm (before clipping) as a tensor; the norm is measured on
    unscaled gradients, which is the only place it means anything under fp16.

    A step whose loss or gradients are not finite is skipped (the parameters and optimizer state
    stay as they were) and counted in `skipped`; `consecutive_skips` says how many in a row. The
    decision and the counters stay on the device (the fused optimizers' `found_inf` flag), so a
    step never waits for the host; the learner reads the counters once per update. The check runs
    after the gradient all-reduce, so all learners skip the same steps. Under fp16 the grad
    scaler's own inf/nan skips (loss-scale calibration) are left to it.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,  # fused Adam/AdamW or a MuonWithAdamW (the config refuses it with fp16)
        max_grad_norm: float | None,
        precision: str,  # `algo.precision`; `auto` resolves for `device` (never to fp16, so never a scaler)
        device: torch.device,
        average_grads: bool = False,  # for tensors outside DDP modules (SAC's log-temperature)
        project: Callable[[Tensor], None] | None = None,  # after every step, given `step taken` (SimbaV2)
    ):
        self.optimizer = optimizer
        self.project = project
        self.average_grads = average_grads
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.max_grad_norm = max_grad_norm
        # built with the algorithm, on the learner's device: where an explicit bf16 is emulated, this warns
        self.scaler = torch.amp.GradScaler(device.type) if resolve_precision(precision, device) == "fp16" else None
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.consecutive_skips = torch.zeros((), dtype=torch.int64, device=device)

    def __call__(self, loss: Tensor) -> Tensor:
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
        norm = nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=loss.device)
        if self.max_grad_norm is not None:  # a non-finite norm makes the gradients non-finite: the step is skipped
            nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            taken = torch.ones((), dtype=torch.bool, device=loss.device)
        else:
            taken = torch.isfinite(norm) & torch.isfinite(loss.detach())
            count_skip_(self.skipped, self.consecutive_skips, taken)
            step_if_(self.optimizer, taken)
        if self.project is not None:
            self.project(taken)
        return norm.detach()

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if isinstance(self.optimizer, torch.optim.Optimizer):  # a MuonWithAdamW restores its own
            tensor_lrs_(self.optimizer)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def count_skip_(skipped: Tensor, consecutive: Tensor, taken: Tensor) -> None:
    """Device counters of skipped steps: the total, and the current run of them."""
    skipped.add_(~taken)
    consecutive.add_(1).mul_(~taken)


def step_if_(optimizer: torch.optim.Optimizer | MuonWithAdamW, taken: Tensor) -> None:
    """`optimizer.step()` where `taken` (a device bool) holds, and nothing at all where it does not,
    without a host read: the fused optimizers skip on their `found_inf` flag (parameters, moments
    and step count untouched); any other has its step undone on the device."""
    if isinstance(optimizer, MuonWithAdamW):
        muon, adamw = optimizer.parts
        undone_unless_(muon, taken)
        step_if_(adamw, taken)
    elif optimizer.defaults.get("fused"):
        optimizer.found_inf = (~taken).float()
        optimizer.step()
    else:
        undone_unless_(optimizer, taken)


@torch.no_grad()
def undone_unless_(optimizer: torch.optim.Optimizer, taken: Tensor) -> None:
    """The step of an optimizer without a fused skip (Muon, SGD), then parameters and state tensors
    put back where not `taken`; state the step created starts from zero, as a fresh one would."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [
        (p.clone(), {key: value.clone() for key, value in optimizer.state[p].items() if isinstance(value, Tensor)})
        for p in params
    ]
    optimizer.step()
    for p, (old, old_state) in zip(params, saved, strict=True):
        p.copy_(torch.where(taken, p, old))
        for key, value in optimizer.state[p].items():
            if isinstance(value, Tensor):
                value.copy_(torch.where(taken, value, old_state.get(key, torch.zeros_like(value))))


@torch.no_grad()
def polyak_update_(online: nn.Module, target: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, for every parameter, in one fused call."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
