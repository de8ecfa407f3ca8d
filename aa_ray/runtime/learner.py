"""Learner: owns the algorithm object and turns replay samples into updates and weights."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from aa_ray.algos import build_algorithm
from aa_ray.algos.common import Batch
from aa_ray.spec.experiment import ExperimentSpec


def learner_device(spec: ExperimentSpec) -> torch.device:
    """CUDA when the spec gives the learner a GPU, the CPU otherwise."""
    if spec.learners.gpus_per_learner > 0:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "learners.gpus_per_learner > 0 but this learner sees no CUDA device; "
                "set learners.gpus_per_learner=0 to train on the CPU"
            )
        return torch.device("cuda")
    return torch.device("cpu")


class Learner:
    def __init__(self, spec: ExperimentSpec, obs_dim: int, act_dim: int):
        torch.set_num_threads(spec.learners.torch_threads)
        torch.manual_seed(spec.seed)
        self.spec = spec
        self.device = learner_device(spec)
        planned_steps = spec.budget.env_steps // spec.transitions_per_fleet_step
        self.algo = build_algorithm(spec.algo, obs_dim, act_dim, self.device, planned_steps)
        self.weights_version = 0
        self.critic_updates = 0

    def update(self, samples: dict[str, np.ndarray], norm_stats: list[dict]) -> dict[str, float]:
        """One learner iteration. `samples` stacks (fleet_steps * utd_ratio, batch) transitions;
        `norm_stats` are the runners' observation and return moments of the data added since the
        last call, merged into the normalizers here so they stay frozen during the updates."""
        start = time.perf_counter()
        for stats in norm_stats:
            self.algo.policy.obs_norm.merge(*stats["obs"])
            self.algo.reward_norm.merge(*stats["return"])
        batches = Batch.from_numpy(samples, self.device)
        utd = self.spec.algo.utd_ratio
        fleet_steps = len(batches) // utd
        info: dict[str, float] = {}
        for step in range(fleet_steps):
            stack = Batch(*(t[step * utd : (step + 1) * utd] for t in batches))
            info = self.algo.update(stack, diagnostics=step == fleet_steps - 1)
        self.critic_updates += len(batches)
        self.weights_version += 1
        info["learner/update_time_s"] = time.perf_counter() - start
        info["learner/critic_updates"] = float(self.critic_updates)
        return info

    def policy_state(self) -> tuple[dict[str, torch.Tensor], int]:
        return self.algo.policy_state(), self.weights_version

    def state_dict(self) -> dict[str, Any]:
        return {
            "algo": _to_cpu(self.algo.state_dict()),
            "weights_version": self.weights_version,
            "critic_updates": self.critic_updates,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algo.load_state_dict(state["algo"])
        self.weights_version = int(state["weights_version"])
        self.critic_updates = int(state["critic_updates"])
        torch.set_rng_state(state["torch_rng"])


def _to_cpu(tree: Any) -> Any:
    """Checkpoints hold CPU tensors so a GPU run's checkpoint loads on a CPU-only machine."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_cpu(v) for v in tree)
    return tree
