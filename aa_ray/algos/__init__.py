"""Algorithms, one file per variant. This registry is the only place that lists them."""

from __future__ import annotations

from typing import Any

import torch

from aa_ray.algos import sac, sac_simba
from aa_ray.nets.policy import SquashedGaussianPolicy

# name -> (algorithm class, acting-module factory)
ALGORITHMS: dict[str, tuple[type, Any]] = {
    "sac": (sac.SAC, sac.make_policy),
    "sac_simba": (sac_simba.SACSimba, sac_simba.make_policy),
}


def build_algorithm(cfg: Any, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int) -> Any:
    algo_cls, _ = ALGORITHMS[cfg.name]
    return algo_cls(cfg, obs_dim, act_dim, device, planned_steps)


def build_policy(cfg: Any, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    _, make_policy = ALGORITHMS[cfg.name]
    return make_policy(cfg, obs_dim, act_dim)
