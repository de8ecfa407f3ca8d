"""What an update is made of besides its math: one gradient step (clipping, mixed precision, the
finite check), the optimizer choice, the learning-rate schedule, polyak averaging, TD3's delayed
actor steps, training and evaluation mode, reward normalization and the RLPD batch split. Algorithm
files call these."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray.algos.precision import autocast_dtype, resolve_precision
from aa_ray.records import Batch


def prior_rows(batch_size: int, ratio: float) -> int:
    """RLPD: how many of a batch's rows come from the prior dataset (they come first)."""
    return round(ratio * batch_size)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """`algo.precision` around a forward: `auto` resolved for `device` (aa_ray/algos/precision.py)."""
    dtype = autocast_dtype(precision, device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


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


def fused_adam(
    params: Iterable[Tensor] | Iterable[dict], lr: float, weight_decay: float = 0.0, beta1: float = 0.9
) -> torch.optim.Adam:
    """Adam (AdamW with weight decay) with the fused kernel, which can skip a step on the device
    (`step_if_`), and tensor learning rates, which a schedule moves without recompiling a
    compiled step."""
    kind = torch.optim.AdamW if weight_decay else torch.optim.Adam
    optimizer = kind(params, lr=lr, weight_decay=weight_decay, betas=(beta1, 0.999), fused=True)
    tensor_lrs_(optimizer)
    return optimizer


def tensor_lrs_(optimizer: torch.optim.Optimizer) -> None:
    """Every group's lr as a 0-d tensor on its parameters' device, and the kernel choice this build
    made: a loaded state brings its saved groups' options (float lrs, an older checkpoint's
    unfused Adam)."""
    for group in optimizer.param_groups:
        for option in ("fused", "foreach"):
            if option in optimizer.defaults:
                group[option] = optimizer.defaults[option]
        lr, device = group["lr"], group["params"][0].device
        if not isinstance(lr, Tensor) or lr.device != device:
            group["lr"] = torch.tensor(float(lr), device=device)


def make_optimizer(module: nn.Module, kind: str, lr: float) -> torch.optim.Optimizer | MuonWithAdamW:
    """Adam for everything, or Muon for the hidden weight matrices and AdamW for the rest
    (embeddings, heads, biases, gains), as the Muon authors recommend."""
    params = [p for p in module.parameters() if p.requires_grad]
    if kind == "adam":
        return fused_adam(params, lr)
    matrices = _hidden_matrices(module)
    ids = {id(p) for p in matrices}
    rest = [p for p in params if id(p) not in ids]
    adamw = fused_adam(rest, lr, weight_decay=0.01)  # torch's AdamW default decay
    if not matrices:  # e.g. an ensemble's stacked (members, in, out) weights: torch's Muon takes 2-D only
        return adamw
    return MuonWithAdamW(torch.optim.Muon(matrices, lr=lr), adamw)


def _hidden_matrices(module: nn.Module) -> list[Tensor]:
    """2-D weights that are neither the first nor the last layer of the module."""
    matrices = [p for name, p in module.named_parameters() if p.ndim == 2 and "weight" in name and p.requires_grad]
    return matrices[1:-1]


class MuonWithAdamW:
    """Muon and AdamW stepping together, so algorithm code sees one optimizer."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.parts = (muon, adamw)

    @property
    def param_groups(self) -> list[dict]:  # looked up each time: loading a state replaces the group dicts
        return self.parts[0].param_groups + self.parts[1].param_groups

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
        tensor_lrs_(self.parts[1])


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


@torch.no_grad()
def polyak_update_(online: nn.Module, target: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, for every parameter, in one fused call."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def compile_networks_(modules: Iterable[nn.Module], device: torch.device) -> None:
    """torch.compile each module's forward in place (checkpoint keys unchanged); AOTAutograd
    compiles the matching backward. On CUDA the compiled graphs are also captured as CUDA graphs
    ("reduce-overhead"), which removes the kernel-launch cost that dominates small networks."""
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    for module in modules:
        module.compile(mode=mode, dynamic=False)


def delayed_actor_steps(
    batch: Batch, steps_done: int, delay: int, critic_step: Callable[[Batch], dict[str, Tensor]],
    actor_step: Callable[[Batch], dict[str, Tensor]],
) -> tuple[dict[str, Tensor], int]:
    """TD3's schedule (CrossQ takes it too): a critic step on every batch of the stack, and after
    every `delay`-th critic step of the run (`steps_done` before this stack) an actor step on the
    same batch. Returns the diagnostics and the critic steps done."""
    info: dict[str, Tensor] = {}
    for i in range(batch.num_batches):
        b = batch.at(i)
        info |= critic_step(b)
        steps_done += 1
        if steps_done % delay == 0:
            info |= actor_step(b)
    return info, steps_done


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """The module scores an input without collecting weight gradients (saves a third of the
    actor's backward when the critics only judge its action)."""
    module.requires_grad_(False)
    try:
        yield module
    finally:
        module.requires_grad_(True)


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """The module in evaluation mode (batch normalization by its running statistics, no dropout) for
    the duration, then back in the mode it was in."""
    was_training = module.training
    module.train(False)
    try:
        yield module
    finally:
        module.train(was_training)


def scheduled_lr(start: float, end_fraction: float, steps_done: int, planned_steps: int) -> float:
    """Linear from `start` to `start * end_fraction` over `planned_steps`, then constant."""
    progress = min(steps_done / max(planned_steps, 1), 1.0)
    return start * (1.0 + progress * (end_fraction - 1.0))


class LinearLRSchedule:
    """Moves optimizer groups' lrs along `scheduled_lr`, one fleet step at a time. The start rates
    are the ones the groups were built with (a loaded optimizer state does not move them); groups
    are looked up on every change because loading an optimizer's state replaces its group dicts."""

    def __init__(self, groups: Iterable[tuple[Any, int]], end_fraction: float, planned_steps: int):
        # read once, when the run starts
        self.starts = [(optimizer, index, float(optimizer.param_groups[index]["lr"])) for optimizer, index in groups]
        self.end_fraction, self.planned_steps = end_fraction, planned_steps
        self.steps_done = 0

    def advance(self, fleet_steps: int = 1) -> None:
        self.load_state_dict(self.steps_done + fleet_steps)

    def state_dict(self) -> int:  # checkpointed as `steps_done`
        return self.steps_done

    def load_state_dict(self, steps_done: int) -> None:
        self.steps_done = int(steps_done)
        for optimizer, index, start in self.starts:
            lr = scheduled_lr(start, self.end_fraction, self.steps_done, self.planned_steps)
            group = optimizer.param_groups[index]
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr)  # in place: a compiled step keeps reading the same tensor
            else:  # Muon's groups
                group["lr"] = lr

    def current_lr(self) -> Tensor:
        """The first group's lr now, as a diagnostic tensor (no device read)."""
        optimizer, index, _ = self.starts[0]
        return torch.as_tensor(optimizer.param_groups[index]["lr"]).detach().clone()


def every_group(*steps: GradientStep | None) -> list[tuple[Any, int]]:
    """(optimizer, group index) of every group of the given steps, for a schedule."""
    return [(step.optimizer, i) for step in steps if step is not None for i in range(len(step.optimizer.param_groups))]
