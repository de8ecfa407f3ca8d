"""Learner: owns the algorithm object and turns replay samples into updates and weights.

With `learners.num_learners: L > 1` there are L of these actors, one torch process group (gloo on
the CPU, nccl on GPUs) and DDP inside the algorithm (see `aa_ray.ddp`). Setup follows the order
that keeps the ranks identical: join the group, build modules and targets and optimizers (the
algorithm wraps its online modules in DDP last), then copy rank 0's whole state to every rank.
Each learner is given its own shard of every global batch; rank 0 reports metrics and weights.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist

from aa_ray.algos import build_algorithm
from aa_ray.algos.common import Batch
from aa_ray.algos.knobs import GradientStep
from aa_ray.algos.ppo import Rollout
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.spec.experiment import ExperimentSpec


def learner_device(spec: ExperimentSpec) -> torch.device:
    """CUDA when the spec gives the learner a GPU, the CPU otherwise."""
    if spec.learners.gpus_per_learner > 0:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "learners.gpus_per_learner > 0 but this learner sees no CUDA device; "
                "set learners.gpus_per_learner=0 to train on the CPU"
            )
        return torch.device("cuda", 0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
    return torch.device("cpu")


def collective_backend(spec: ExperimentSpec) -> str:
    if spec.learners.backend != "auto":
        return spec.learners.backend
    return "nccl" if spec.learners.gpus_per_learner > 0 else "gloo"


class Learner:
    def __init__(self, spec: ExperimentSpec, obs_dim: int, act_dim: int, rank: int = 0):
        torch.set_num_threads(spec.learners.torch_threads)
        self.spec, self.obs_dim, self.act_dim = spec, obs_dim, act_dim
        self.rank, self.world_size = rank, spec.learners.num_learners
        self.device = learner_device(spec)
        self.weights_version = 0
        self.critic_updates = 0
        self.algo: Any = None
        self.metrics = RunMetrics(run_tag(spec), rank=rank)
        if self.world_size == 1:
            self._build()

    # ---- several learners ----------------------------------------------------------------------
    def rendezvous_address(self) -> str:
        """Rank 0 publishes where the process group meets: this node's address and a free port."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def join(self, address: str) -> None:
        """Join the process group at `address` (blocks until all L learners have joined), then
        build the algorithm and take rank 0's state."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # nccl's object broadcast uses the current device
        dist.init_process_group(
            collective_backend(self.spec),
            init_method=f"tcp://{address}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.spec.learners.collective_timeout_s),
        )
        self._build()
        self._copy_rank0_state()

    def _build(self) -> None:
        torch.manual_seed(self.spec.seed)  # the same on every rank: their sampling noise stays in lockstep
        planned_steps = self.spec.budget.env_steps // self.spec.transitions_per_fleet_step
        self.algo = build_algorithm(self.spec.algo, self.obs_dim, self.act_dim, self.device, planned_steps)

    def _copy_rank0_state(self) -> None:
        """Targets, normalizers and optimizer moments are not DDP's business: copy them all."""
        if self.world_size == 1:
            return
        holder = [self.state_dict() if self.rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        if self.rank != 0:
            self._load(holder[0])

    # ---- training ------------------------------------------------------------------------------
    def update(self, samples: dict[str, Any], norm_stats: list[dict]) -> dict[str, float]:
        """One learner iteration. `samples` stacks (fleet_steps * utd_ratio, batch) transitions (this
        learner's shard of the global batch); `norm_stats` are the runners' observation and return
        moments of the data added since the last call, merged into the normalizers here so they stay
        frozen during the updates (every rank merges the same list, so they agree)."""
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
        info |= self._skips()
        self._record(len(batches), info)
        info["learner/critic_updates"] = float(self.critic_updates)
        return info

    def update_rollouts(self, norm_stats: list[dict], *rollouts: dict[str, Any]) -> dict[str, float]:
        """One on-policy update on the runners' rollouts, each (train_every, E, ...): this learner
        takes its share of the envs. The normalizers take the rollouts' statistics only after the
        update, so the update sees the observations exactly as the acting policy did."""
        start = time.perf_counter()
        columns = {key: np.concatenate([r[key] for r in rollouts], axis=1) for key in rollouts[0]}
        share = columns["reward"].shape[1] // self.world_size
        mine = {key: value[:, self.rank * share : (self.rank + 1) * share] for key, value in columns.items()}
        info = self.algo.update(Rollout.from_numpy(mine, self.device))
        for stats in norm_stats:
            self.algo.policy.obs_norm.merge(*stats["obs"])
            self.algo.reward_norm.merge(*stats["return"])
        self.weights_version += 1
        info["learner/update_time_s"] = time.perf_counter() - start
        info |= self._skips()
        self._record(self.spec.algo.ppo_epochs * self.spec.algo.num_minibatches, info)
        return info

    def _skips(self) -> dict[str, float]:
        """Gradient steps skipped for a non-finite loss or gradient: in all, and the longest current
        run of them (the algorithm's GradientSteps; PPO counts its minibatch steps itself)."""
        steps = [part for part in vars(self.algo).values() if isinstance(part, GradientStep)]
        skipped = sum(step.skipped for step in steps) + getattr(self.algo, "skipped", 0)
        consecutive = max([step.consecutive_skips for step in steps] + [getattr(self.algo, "consecutive_skips", 0)])
        return {"learner/skipped_updates": float(skipped), "learner/consecutive_skips": float(consecutive)}

    def _record(self, updates: int, info: dict[str, float]) -> None:
        self.metrics.inc("aa_ray_learner_updates", updates)
        self.metrics.set("aa_ray_learner_updates_per_s", updates / max(info["learner/update_time_s"], 1e-9))
        self.metrics.losses(info)

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
        self._load(state)
        self._copy_rank0_state()

    def _load(self, state: dict[str, Any]) -> None:
        self.algo.load_state_dict(state["algo"])
        self.weights_version = int(state["weights_version"])
        self.critic_updates = int(state["critic_updates"])
        torch.set_rng_state(state["torch_rng"])

    def parameters_vector(self) -> torch.Tensor:
        """Every trained and target tensor of the model, flattened (to compare learners)."""
        tensors = [v for v in _flatten(self.algo.state_dict()) if v.is_floating_point()]
        return torch.cat([t.detach().reshape(-1).cpu().float() for t in tensors])


def _flatten(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for key in sorted(tree, key=str) for t in _flatten(tree[key])]
    if isinstance(tree, list | tuple):
        return [t for item in tree for t in _flatten(item)]
    return []


def _to_cpu(tree: Any) -> Any:
    """Checkpoints hold CPU tensors so a GPU run's checkpoint loads on a CPU-only machine."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_cpu(v) for v in tree)
    return tree
