"""Learner: owns one algorithm object and turns replay samples (or rollouts) into updates and
versioned weights. A plain class: the driver wraps it in `ray.remote`, tests use it in-process,
and it imports and runs where Ray is not installed.

It talks to the algorithm only through `aa_ray.algos.contract.Algorithm`.

With `learners.num_learners: L > 1` there are L learners, one torch process group (gloo on the
CPU, nccl on GPUs) and DDP inside the algorithm (see `aa_ray.ddp`). Setup follows the order that
keeps the ranks identical: join the group, build modules, targets and optimizers (the algorithm
wraps its online modules in DDP last), then copy rank 0's whole state to every rank. Each learner
is given its own shard of every global batch; rank 0 reports metrics and weights.
"""

from __future__ import annotations

import copy
import logging
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from aa_ray import metric_names as m
from aa_ray import seeding
from aa_ray.algos.contract import Algorithm, TrainingSetup, diagnostics_to_floats
from aa_ray.algos.precision import autocast_dtype
from aa_ray.envs.symmetry import sym_aug_mirror
from aa_ray.nets.policy import state_arrays
from aa_ray.records import (
    Batch,
    LearnerReport,
    LearnerState,
    NormMoments,
    ObsDims,
    PackedTransitions,
    ReplaySample,
    SampleTiming,
    Transitions,
)
from aa_ray.runtime.families import LearnerShard, family_of
from aa_ray.runtime.metrics import RunMetrics, run_tag
from aa_ray.spec.experiment import ExperimentSpec

log = logging.getLogger(__name__)


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


def compiles(spec: ExperimentSpec, device: torch.device) -> bool:
    """`learners.compile`: auto compiles on CUDA only. On the CPU a compiled SAC update measured
    slower than the eager one (benchmarks/RESULTS.md, section 12)."""
    return spec.learners.compile == "on" or (spec.learners.compile == "auto" and device.type == "cuda")


def planned_fleet_steps(spec: ExperimentSpec) -> int:
    """Fleet steps the run will learn from: what learning-rate schedules run over."""
    return spec.budget.env_steps // spec.transitions_per_fleet_step


@contextmanager
def matmul_precision(device: torch.device, precision: str) -> Iterator[None]:
    """`learners.matmul_precision` on CUDA ("high": TF32 matmuls and convolutions, else full fp32)
    for the learner's own work: the switches are process-wide, so they are put back after it."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "high"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class Learner:
    def __init__(self, spec: ExperimentSpec, obs_dim: ObsDims | int, act_dim: int, rank: int = 0):
        self.spec, self.obs, self.act_dim = spec, ObsDims.of(obs_dim), act_dim
        self.rank, self.world_size = rank, spec.learners.num_learners
        self.device = learner_device(spec)
        self.compiled = compiles(spec, self.device)
        self.compile_checked = not self.compiled  # the first compiled update is guarded (`_eager_if_compiling_fails`)
        # what `algo.precision` (auto included) resolves to on this learner's device
        self.bf16 = autocast_dtype(spec.algo.precision, self.device) == torch.bfloat16
        self.feed = DeviceFeed(self.device)
        self.family = family_of(spec)
        self.mirror = sym_aug_mirror(spec, self.obs, act_dim)
        self.shard = LearnerShard(self.device, rank, self.world_size, self.mirror, self.feed)  # what `learn` needs
        self.weights_version = 0
        self.gradient_updates = 0  # every update the algorithm made (critic and actor steps alike count once)
        self.algo: Algorithm | None = None  # built once this learner is in its process group
        self.generator = torch.Generator(self.device)  # every random draw of the updates (seeded in `_build`)
        self.store: dist.TCPStore | None = None  # rank 0 serves the process group's rendezvous
        self.metrics = RunMetrics(run_tag(spec), rank=rank)
        if self.world_size == 1:
            self._build()

    # ---- several learners ----------------------------------------------------------------------
    def rendezvous_address(self, host: str) -> str:
        """Rank 0 opens the process group's store on `host`, this node's own address, and returns
        where it listens. The socket is bound once and handed to the store, so no other process
        can take the port between choosing it and listening on it."""
        listener = socket.create_server((host, 0))
        port = listener.getsockname()[1]
        self.store = dist.TCPStore(
            host, port, self.world_size, is_master=True, master_listen_fd=listener.detach(),
            wait_for_workers=False, timeout=timedelta(seconds=self.spec.learners.collective_timeout_s),
        )
        return f"{host}:{port}"

    def join(self, address: str) -> None:
        """Join the process group at `address` (blocks until all L learners have joined), then
        build the algorithm and take rank 0's state."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # nccl's object broadcast uses the current device
        timeout = timedelta(seconds=self.spec.learners.collective_timeout_s)
        if self.store is None:
            host, port = address.rsplit(":", 1)
            self.store = dist.TCPStore(host, int(port), self.world_size, is_master=False, timeout=timeout)
        dist.init_process_group(
            collective_backend(self.spec), store=self.store, rank=self.rank, world_size=self.world_size,
            timeout=timeout,
        )
        self._build()
        self._copy_rank0_state()

    def _build(self) -> None:
        # the same seed on every rank: their noise stays in lockstep (ddp.randn_shard)
        seed = seeding.learner_seed(self.spec.seed)
        self.generator.manual_seed(seed)
        # torch.nn draws initial weights from torch's own generator: seeded for the construction only,
        # and left as it was after it (other objects may share this process: the inline backend)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            setup = TrainingSetup(self.device, planned_fleet_steps(self.spec), self.generator)
            self.algo = self.family.build(self.spec.algo, self.obs, self.act_dim, setup, self.mirror)
        if self.compiled:
            self.algo.compile(self.device)

    def _copy_rank0_state(self) -> None:
        """Targets, normalizers and optimizer moments are not DDP's business: copy them all."""
        if self.world_size == 1:
            return
        holder = [self.state_dict() if self.rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        if self.rank != 0:
            self._load(holder[0])

    # ---- training ------------------------------------------------------------------------------
    def update(self, norm_stats: Sequence[NormMoments], *data: Any, also_read: torch.Tensor | None = None
               ) -> LearnerReport:
        """One learner iteration on the family's data: one `ReplaySample` (this learner's shard of the
        global batch, (fleet_steps * utd_ratio, batch) transitions; one part of it per replay shard with
        `runtime.replay_shards`) off-policy, or a `DeviceSample` already on this learner's device
        (runtime.mode device), every runner's `RolloutChunk` on-policy. `norm_stats` are the runners'
        moments of the data collected since the last call; every rank merges the same list, so the
        normalizers agree. They are merged before or after the updates as the family says
        (`merge_moments_first`). `also_read`: a tensor on this device the caller needs on the host too
        (runtime.mode device's counts and episodes), read in the same transfer as the diagnostics and
        returned in the report's `read_with`."""
        with matmul_precision(self.device, self.spec.learners.matmul_precision):
            return self._eager_if_compiling_fails(lambda: self._update(norm_stats, data, also_read))

    def merge_moments(self, norm_stats: Sequence[NormMoments]) -> None:
        """Fold moments into the normalizers outside an update (runtime.mode device's warm-up, whose
        moments never wait in a driver's queue)."""
        self._merge(norm_stats)

    def _update(self, norm_stats: Sequence[NormMoments], data: tuple[Any, ...],
                also_read: torch.Tensor | None = None) -> LearnerReport:
        start, received = time.perf_counter(), time.time()
        if self.family.merge_moments_first:
            self._merge(norm_stats)
        learned = self.family.learn(self.algo, self.spec.algo, data, self.shard)
        if not self.family.merge_moments_first:
            self._merge(norm_stats)
        self.gradient_updates += learned.updates
        report = self._finish(learned.diagnostics, learned.updates, start, also_read)
        report.metrics[m.LEARNER_GRADIENT_UPDATES] = float(self.gradient_updates)
        samples = [sample for sample in data if isinstance(sample, ReplaySample)]
        if samples:  # the replay actors' timings (runtime/phases.py)
            timing = SampleTiming.together([sample.timing for sample in samples])
            report.phases[m.PHASE_REPLAY_SAMPLE] = timing.sample_s
            report.phases[m.PHASE_TRANSFER] = max(received - timing.sampled_at, 0.0)
        return report

    def _eager_if_compiling_fails(self, update: Callable[[], LearnerReport]) -> LearnerReport:
        """Compilation happens inside the first compiled update. If it fails there, the learner says
        so once, goes back to the state from before that update and trains eagerly from then on."""
        if self.compile_checked:
            return update()
        before = copy.deepcopy(self.state_dict())
        try:
            info = update()
        except Exception as err:  # dynamo and inductor raise many types; an eager rerun re-raises real bugs
            self.compiled = False
            self._build()
            self._load(before)
            info = update()  # a bug of the update itself raises here, before any word about compiling
            log.warning(
                "learners.compile: compiling the update failed on this machine (%s: %s); training eagerly",
                type(err).__name__, " ".join(str(err).split())[:400],
            )
        self.compile_checked = True
        return info

    def _merge(self, norm_stats: Sequence[NormMoments]) -> None:
        for moments in norm_stats:
            self.algo.merge_stats(moments.obs, moments.returns)

    def _finish(self, diagnostics: dict[str, Any], updates: int, start: float,
                also_read: torch.Tensor | None = None) -> LearnerReport:
        """The iteration's diagnostics and the algorithm's health (and `also_read`), read on the host
        in one transfer (the only device sync of the iteration)."""
        health = self.algo.health()
        named = diagnostics | {
            m.LEARNER_SKIPPED_UPDATES: health.skipped_updates,
            m.LEARNER_CONSECUTIVE_SKIPS: health.consecutive_skips,
            m.LEARNER_LARGEST_VALUE: health.largest_value,
        }
        read_with: list[float] = []
        if also_read is None:
            info = diagnostics_to_floats(named)
        else:
            info, read_with = _read_together(named, also_read)
        self.weights_version += 1
        info[m.LEARNER_UPDATE_TIME_S] = time.perf_counter() - start
        info[m.LEARNER_COMPILED] = float(self.compiled)
        info[m.LEARNER_BF16] = float(self.bf16)
        self.metrics.inc("aa_ray_learner_updates", updates)
        self.metrics.set("aa_ray_learner_updates_per_s", updates / max(info[m.LEARNER_UPDATE_TIME_S], 1e-9))
        self.metrics.losses(info)
        return LearnerReport(info, updates, read_with=read_with)

    def policy_state(self, device: torch.device | str = "cpu") -> tuple[dict[str, torch.Tensor], int]:
        return self.algo.policy_state(device), self.weights_version

    def published_weights(self) -> tuple[dict[str, np.ndarray], int]:
        """`policy_state` on the host as numpy arrays (`nets.policy.state_arrays`): what the graph
        sends the env runners."""
        state, version = self.policy_state()
        return state_arrays(state), version

    def state_dict(self) -> LearnerState:
        return LearnerState(
            algo=_to_cpu(self.algo.state_dict()), weights_version=self.weights_version,
            gradient_updates=self.gradient_updates, noise_generator=self.generator.get_state(),
        )

    def load_state_dict(self, state: LearnerState) -> None:
        self._load(state)
        self._copy_rank0_state()

    def _load(self, state: LearnerState) -> None:
        self.algo.load_state_dict(state.algo)
        self.weights_version = state.weights_version
        self.gradient_updates = state.gradient_updates
        if state.noise_generator is not None:
            self.generator.set_state(state.noise_generator)
        elif state.global_cpu_generator is not None and self.device.type == "cpu":
            # an older checkpoint's updates drew from torch's global CPU generator: this one goes on from it
            self.generator.set_state(state.global_cpu_generator)

    def parameters_vector(self) -> torch.Tensor:
        """Every trained and target tensor of the model, flattened (to compare learners)."""
        tensors = [v for v in _flatten(self.algo.state_dict()) if v.is_floating_point()]
        return torch.cat([t.detach().reshape(-1).cpu().float() for t in tensors])


class DeviceFeed:
    """Moves a learner iteration's replay sample to the device and hands it out one fleet step at a
    time. On CUDA the host arrays go through pinned memory and every fleet step's copy is queued at
    once on a side stream, so fleet step k+1 is copied while k trains and the host never waits; on
    the CPU it is one tensor copy, sliced."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def fleet_steps(self, parts: Sequence[Transitions | PackedTransitions], utd: int) -> Iterator[Batch]:
        """`parts`: one sample, or one per replay shard, laid side by side in every batch (on their
        batch axis) as they are copied, never joined first."""
        packed = [p if isinstance(p, PackedTransitions) else PackedTransitions.pack(p) for p in parts]
        num_rows = packed[0].rows
        if self.stream is None:
            columns = dict(zip(Transitions._fields, packed[0].columns(), strict=True))
            for first in range(0, num_rows, utd):
                pieces = [p.table[first : first + utd] for p in packed]
                # one copy per field: arrays from Ray's object store are read-only views
                yield Batch(*(torch.from_numpy(_side_by_side([piece[..., columns[name]] for piece in pieces]))
                              .to(self.device) for name in Batch._fields))
            return
        # the whole sample in one pinned buffer, one host copy (the object store's array is read-only)
        shape = (num_rows, sum(p.table.shape[1] for p in packed), *packed[0].table.shape[2:])
        pinned = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        np.concatenate([p.table for p in packed], axis=1, out=pinned.numpy())
        compute = torch.cuda.current_stream(self.device)
        staged = []
        with torch.cuda.stream(self.stream):
            for first in range(0, num_rows, utd):
                rows = pinned[first : first + utd].to(self.device, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self.stream)
                staged.append((rows, copied))
        for rows, copied in staged:
            compute.wait_event(copied)
            rows.record_stream(compute)  # allocated on the side stream, used on this one
            yield Batch.from_rows(rows, packed[0])  # the fields split on the device


def _side_by_side(arrays: list[np.ndarray]) -> np.ndarray:
    """A float32 copy of the arrays joined on their batch axis (of the one array, if one)."""
    return np.array(arrays[0], np.float32) if len(arrays) == 1 else np.concatenate(arrays, axis=1, dtype=np.float32)


def _read_together(named: dict[str, Any], also_read: torch.Tensor) -> tuple[dict[str, float], list[float]]:
    """`diagnostics_to_floats` with a vector of the caller's appended: both in one host transfer."""
    names = list(named)
    scalars = [torch.as_tensor(named[name], dtype=torch.float64, device=also_read.device).detach().reshape(())
               for name in names]
    values = torch.cat([torch.stack(scalars), also_read.detach().to(torch.float64).reshape(-1)]).tolist()
    return dict(zip(names, values[: len(names)], strict=True)), values[len(names):]


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
