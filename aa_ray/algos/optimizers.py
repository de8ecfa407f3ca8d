"""The optimizers an update steps: fused Adam/AdamW with tensor learning rates, or Muon for the hidden
weight matrices beside AdamW for the rest."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


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


def make_optimizer(
    module: nn.Module, kind: str, lr: float, beta1: float = 0.9
) -> torch.optim.Optimizer | MuonWithAdamW:
    """Adam for everything, or Muon for the hidden weight matrices and AdamW for the rest
    (embeddings, heads, biases, gains), as the Muon authors recommend. `beta1`: Adam's first-moment
    decay (CrossQ's 0.5)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if kind == "adam":
        return fused_adam(params, lr, beta1=beta1)
    matrices = _hidden_matrices(module)
    ids = {id(p) for p in matrices}
    rest = [p for p in params if id(p) not in ids]
    adamw = fused_adam(rest, lr, weight_decay=0.01, beta1=beta1)  # torch's AdamW default decay
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
