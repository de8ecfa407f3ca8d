"""The typed records on every hop of a run, with one name per field from the env runner to the
replay buffer to the learner:

    EnvRunner.sample        -> (Transitions, ChunkStats)       off-policy chunk, one row per stored transition
    ReplayBuffer.sample_for_learners -> ReplaySample           PackedTransitions stacked (batches, batch_size,
                                                               width): one array, and the SampleTiming beside it
    Learner (on its device) -> Batch                           what an off-policy algorithm's update reads
    DeviceReplay.sample     -> DeviceSample (a Batch)          runtime.mode device: drawn on the learner's own device
    EnvRunner.sample_rollout-> (RolloutChunk, ChunkStats)      on-policy chunk, (steps, envs, ...)
    Learner (on its device) -> Rollout                         what an on-policy algorithm's update reads
    Learner.update          -> LearnerReport                   diagnostics, update count, phases beside them

`ChunkStats` carries a chunk's counts, finished episodes (`EpisodeStats`), the normalizer moments
the learners merge (`NormMoments`) and the chunk's timings. A dataset's column names (RLlib's
SingleAgentEpisode names) are mapped onto these fields in `aa_ray.data.dataset`, its one place.

Between the layers: `ObsDims` (what the envs, the networks and the runtime agree an observation
is), `PriorData` (an RLPD dataset as the replay actor loaded it), `RunOutcome` (what a training run
returns) and the checkpoint, `Checkpoint` (`CheckpointParts`: `LearnerState`, the replay's and the
runners' state, `DriverCheckpoint` with its `RunCounters`, the tracked runs), whatever format wrote
it (`aa_ray.runtime.checkpoint` writes and reads the file).

Every record here is plain data: numpy on the host, torch on the learner's device. Ray pickles
them between actors; a checkpoint file keeps them as plain dicts (`NormMoments.to_dict`), which
`torch.load(weights_only=True)` reads without running any code."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:  # torch is imported where a record becomes tensors: the replay actor never needs it
    import torch
    from torch import Tensor


class ObsDims(NamedTuple):
    """Observation features: all of them (`full`: what replay stores and the critic reads) and the
    leading `actor` of them that the actor reads (fewer with grouped observations, where the critic
    also sees privileged keys: `aa_ray.envs.obs_groups`). `groups` names each key's features in
    order, empty for a flat Box."""

    actor: int
    full: int
    groups: tuple[tuple[str, int], ...] = ()

    @property
    def actor_keys(self) -> tuple[str, ...]:
        """The Dict keys the actor reads: the leading groups, `actor` features in all."""
        keys, features = [], 0
        for key, dim in self.groups:
            if features == self.actor:
                break
            keys.append(key)
            features += dim
        return tuple(keys)

    @classmethod
    def of(cls, obs: ObsDims | int) -> ObsDims:
        """A flat Box's dims from its size (tests and tools pass an int)."""
        return obs if isinstance(obs, ObsDims) else cls(obs, obs)


# (count, mean, var) of raw observations, as the env runners measure them; (0, None, None) if none
ObsMoments = tuple[int, Any, Any]
# (count, mean, var, max |G|) of the raw discounted returns G the env runners track
ReturnMoments = tuple[int, float, float, float]


def return_moments(returns: Iterable[float]) -> ReturnMoments:
    values = np.asarray(list(returns), np.float64)
    if values.size == 0:
        return 0, 0.0, 1.0, 0.0
    return int(values.size), float(values.mean()), float(values.var()), float(np.abs(values).max())


def obs_moments(obs: np.ndarray) -> ObsMoments:
    """Moments of a (rows, features) block of raw observations."""
    if not len(obs):
        return 0, None, None
    flat = obs.astype(np.float64)
    return len(flat), flat.mean(0), flat.var(0)


class NormMoments(NamedTuple):
    """What one chunk (or a prior dataset) adds to the learners' observation and reward normalizers."""

    obs: ObsMoments
    returns: ReturnMoments

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint form (the one written before these records had types)."""
        return {"obs": self.obs, "return": self.returns}

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> NormMoments:
        return cls(tuple(saved["obs"]), tuple(saved["return"]))


class EpisodeStats(NamedTuple):
    """A finished episode: its return, length and the tracked info keys' values at its last step
    (`aa_ray.envs.info_metrics`)."""

    episode_return: float
    length: float
    info: dict[str, float]


@dataclass
class ChunkStats:
    """What an env runner reports with each chunk it collected."""

    env_steps: int
    episodes: list[EpisodeStats]
    policy_version: int  # the weights the chunk was collected with
    moments: NormMoments
    collect_s: float = 0.0  # stepping the envs and the policy
    weights_s: float = 0.0  # loading published weights since the previous chunk (the publish phase)


class Transitions(NamedTuple):
    """Stored transitions as numpy arrays with a leading row dim (or (batches, batch_size) when
    sampled). `discount` is gamma^k of a k-step transition."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    discount: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.reward)

    @classmethod
    def empty(cls, rows: int, obs_dim: int, act_dim: int) -> Transitions:
        """Zeroed arrays for `rows` transitions (the replay buffer's storage)."""
        return cls(
            obs=np.zeros((rows, obs_dim), np.float32), action=np.zeros((rows, act_dim), np.float32),
            reward=np.zeros(rows, np.float32), next_obs=np.zeros((rows, obs_dim), np.float32),
            terminated=np.zeros(rows, np.float32), truncated=np.zeros(rows, np.float32),
            discount=np.zeros(rows, np.float32),
        )

    def take(self, index: Any) -> Transitions:
        return Transitions(*(column[index] for column in self))

    @classmethod
    def concat(cls, parts: Sequence[Transitions], axis: int = 0) -> Transitions:
        return cls(*(np.concatenate(columns, axis=axis) for columns in zip(*parts, strict=True)))


class PackedTransitions(NamedTuple):
    """Transitions as one float32 array with every field side by side in each row (obs | action |
    reward | next_obs | terminated | truncated | discount, `Transitions`' order): the replay buffer's
    storage and its samples. Drawing a batch is then one gather of whole rows (the fields' seven
    gathers cost several times more, mostly in cache misses), and a sample crosses the object store
    as one buffer, which a learner reads without a copy and moves to its device in one transfer."""

    table: np.ndarray  # (..., width): rows of packed transitions
    obs_dim: int
    act_dim: int

    @classmethod
    def empty(cls, rows: int, obs_dim: int, act_dim: int) -> PackedTransitions:
        return cls(np.zeros((rows, 2 * obs_dim + act_dim + 4), np.float32), obs_dim, act_dim)

    @classmethod
    def pack(cls, transitions: Transitions) -> PackedTransitions:
        obs_dim, act_dim = transitions.obs.shape[-1], transitions.action.shape[-1]
        columns = [np.asarray(column, np.float32) for column in transitions]
        table = np.concatenate([c if c.ndim == columns[0].ndim else c[..., None] for c in columns], axis=-1)
        return cls(table, obs_dim, act_dim)

    @property
    def rows(self) -> int:
        return self.table.shape[0]

    def columns(self) -> tuple[Any, ...]:
        """Each field's index into a row, in `Transitions`' order (slices for vectors)."""
        o, a = self.obs_dim, self.act_dim
        return slice(0, o), slice(o, o + a), o + a, slice(o + a + 1, 2 * o + a + 1), 2 * o + a + 1, \
            2 * o + a + 2, 2 * o + a + 3

    def unpack(self) -> Transitions:
        """The fields as views into the table (writing into them writes the table)."""
        return Transitions(*(self.table[..., column] for column in self.columns()))

    def take(self, index: np.ndarray) -> PackedTransitions:
        return PackedTransitions(np.take(self.table, index, axis=0), self.obs_dim, self.act_dim)

    @classmethod
    def concat(cls, parts: Sequence[PackedTransitions], axis: int) -> PackedTransitions:
        return cls(np.concatenate([p.table for p in parts], axis=axis), parts[0].obs_dim, parts[0].act_dim)


class SampleTiming(NamedTuple):
    """How long the replay actor took to sample a shard, and when it was done (the learner's
    time/replay_sample and time/transfer phases)."""

    sample_s: float
    sampled_at: float  # time.time() on the replay actor's node

    @classmethod
    def together(cls, timings: Sequence[SampleTiming]) -> SampleTiming:
        """The replay shards' parts of one sample were drawn at once: the slowest is the sampling
        time, and the transfer counts from the earliest."""
        return cls(max(t.sample_s for t in timings), min(t.sampled_at for t in timings))


class ReplaySample(NamedTuple):
    """One learner's shard of a learner iteration: (fleet_steps * utd_ratio, batch, ...) transitions."""

    transitions: PackedTransitions
    timing: SampleTiming


class Batch(NamedTuple):
    """Replay transitions as tensors on the learner's device. Leading dims are (updates, batch) for a
    stacked batch."""

    obs: Tensor
    action: Tensor
    reward: Tensor
    next_obs: Tensor
    terminated: Tensor
    discount: Tensor  # gamma^k for a k-step transition

    @classmethod
    def from_transitions(cls, transitions: Transitions, device: torch.device) -> Batch:
        import torch

        # copies: arrays from Ray's object store are read-only views
        return cls(*(torch.tensor(getattr(transitions, f), device=device, dtype=torch.float32) for f in cls._fields))

    @classmethod
    def from_rows(cls, rows: torch.Tensor, packed: PackedTransitions) -> Batch:
        """The fields of packed transition rows already on the device, each its own contiguous tensor."""
        columns = dict(zip(Transitions._fields, packed.columns(), strict=True))
        return cls(*(rows[..., columns[name]].contiguous() for name in cls._fields))

    @property
    def num_batches(self) -> int:
        """Stacked batches (the leading dim)."""
        return self.obs.shape[0]

    def at(self, index: int) -> Batch:
        return Batch(*(t[index] for t in self))


class DeviceSample(NamedTuple):
    """A learner iteration's batches drawn on the learner's own device (`runtime.mode: device`, whose
    replay ring lives there: `aa_ray.runtime.device_replay`): a `Batch` with leading dims
    (fleet_steps * utd_ratio, batch), handed to the updates without any copy."""

    batch: Batch

    @property
    def rows(self) -> int:
        """Stacked batches."""
        return self.batch.num_batches

    def fleet_steps(self, utd: int) -> Iterator[Batch]:
        """One fleet step's `utd` batches at a time (views, no copy)."""
        for first in range(0, self.rows, utd):
            yield Batch(*(field[first : first + utd] for field in self.batch))


class RolloutChunk(NamedTuple):
    """On-policy data of shape (steps, envs, ...) as an env runner measured it while acting."""

    obs: np.ndarray
    action: np.ndarray  # unclipped, as sampled
    log_prob: np.ndarray  # log pi_old(action|obs)
    value: np.ndarray  # V_old(obs)
    reward: np.ndarray
    next_value: np.ndarray  # V_old(true next obs): the final observation at a truncation
    terminated: np.ndarray
    truncated: np.ndarray

    @property
    def envs(self) -> int:
        return self.reward.shape[1]

    @classmethod
    def side_by_side(cls, chunks: Sequence[RolloutChunk]) -> RolloutChunk:
        """Several runners' chunks as one, their envs side by side."""
        return cls(*(np.concatenate(columns, axis=1) for columns in zip(*chunks, strict=True)))

    def envs_slice(self, start: int, stop: int) -> RolloutChunk:
        return RolloutChunk(*(column[:, start:stop] for column in self))


class Rollout(NamedTuple):
    """A `RolloutChunk` as tensors on the learner's device."""

    obs: Tensor
    action: Tensor
    log_prob: Tensor
    value: Tensor
    reward: Tensor
    next_value: Tensor
    terminated: Tensor
    truncated: Tensor

    @classmethod
    def from_chunk(cls, chunk: RolloutChunk, device: torch.device) -> Rollout:
        import torch

        return cls(*(torch.tensor(column, device=device, dtype=torch.float32) for column in chunk))


class PriorData(NamedTuple):
    """What the replay actor loaded from an RLPD run's prior dataset (`algo.prior_data`)."""

    rows: int
    obs: ObsMoments  # the moments of its observations, which seed the observation normalizer


class RunCounters(NamedTuple):
    """How far a run has come, and when it evaluates next (a checkpoint's `counters`)."""

    env_steps: int
    iterations: int
    episodes: int
    next_eval: int  # the env steps at which the next evaluation is due


class DriverCheckpoint(NamedTuple):
    """The driver's own part of a checkpoint, so a resumed run counts, evaluates and averages as the
    uninterrupted one would have."""

    counters: RunCounters
    pending_stats: list[NormMoments]  # normalizer moments collected but not merged by the learners yet
    returns: list[float]  # the recent episodes' returns that train/* averages over
    infos: dict[str, list[float]]  # the recent episodes' task metrics, by info key


class LearnerState(NamedTuple):
    """A learner's whole state (learner 0's goes into a checkpoint): the algorithm's networks,
    targets, optimizers and normalizers, and the learner's own counts and random stream."""

    algo: dict[str, Any]
    weights_version: int
    gradient_updates: int  # every update the algorithm made
    noise_generator: Tensor | None  # the updates' random stream (`torch.Generator.get_state()`)
    # checkpoints from before the learner had a generator of its own kept torch's global CPU one
    global_cpu_generator: Tensor | None = None


@dataclass(kw_only=True)
class CheckpointParts:
    """What a run saves beside its spec (`checkpoint.save_checkpoint` writes it, `load_checkpoint`
    reads it back from any format). Every part is optional: a checkpoint for rollouts and exports
    holds only the learner."""

    learner: LearnerState | None = None
    replay: dict[str, Any] = field(default_factory=dict)  # `ReplayBuffer.state()`; empty without one
    runners: list[dict[str, Any]] = field(default_factory=list)  # each runner's `state()`, in order
    driver: DriverCheckpoint | None = None  # None: not written by a training run (it cannot resume)
    tracking: dict[str, str] = field(default_factory=dict)  # the run's id in each tracking backend, by name


@dataclass(kw_only=True)
class Checkpoint(CheckpointParts):
    """A checkpoint as read back: its parts in today's form whatever format wrote them."""

    folder: Path  # where it was read from (what messages name)
    spec: dict[str, Any]  # the stored spec, unvalidated: validating imports the code it names
    replay_rows: int | None = None  # the rows of the replay file written with it; None without one
    written_format: int  # the format version of the file


@dataclass(frozen=True)
class RunOutcome:
    """What a training run (`Trainer.run`) returns: how it ended and where its results are. The
    API's `RunResult` is made from it."""

    env_steps: int
    evals: list[dict[str, float]]  # every evaluation's metrics, in order
    stop_reason: str  # "budget", "target reached", "stopped by a callback" or "preempted"
    checkpoint: Path  # the final checkpoint (a preempted run's: the one written on the way out)
    run_dir: Path
    mlflow_run_id: str | None  # None: not tracked in MLflow
    mlflow_url: str | None
    tracking_runs: dict[str, str]  # the run's id in each tracking backend, by name
    replay_size: int  # transitions in the replay buffer at the end
    prior_size: int  # rows of algo.prior_data in the prior buffer; 0 without
    runner_restarts: int
    graph_restarts: int


@dataclass
class LearnerReport:
    """What a learner iteration returns (rank 0's is the one read): its diagnostics and health as
    floats, the gradient updates it made, and the seconds of the phases measured outside the
    learner (the replay sample it trained on, its transfer), beside the metrics."""

    metrics: dict[str, float]
    updates: int
    phases: dict[str, float] = field(default_factory=dict)
    # values the caller asked to have read in the same transfer as the metrics (`Learner.update`'s
    # `also_read`: runtime.mode device's counts and episodes), in its order; empty otherwise
    read_with: list[float] = field(default_factory=list)


def prior_rows(batch_size: int, ratio: float) -> int:
    """RLPD: how many of a batch's rows come from the prior dataset (they come first); the replay
    buffer draws them and the algorithms' diagnostics read them by this one count."""
    return round(ratio * batch_size)


def rows_per_replay_shard(batch_size: int, prior: int, shards: int) -> list[tuple[int, int]]:
    """(prior rows, online rows) each replay shard draws for a batch of `batch_size` rows with
    `prior` prior rows: shard 0 holds the prior dataset and draws its rows; the online rows are split
    as evenly as they go (the first shards draw one more where they do not divide). The shards hold
    the same number of rows (each takes the same runners' chunks), so every stored transition is about
    as likely to be drawn as from one buffer."""
    online = batch_size - prior
    return [(prior if shard == 0 else 0, online // shards + (shard < online % shards)) for shard in range(shards)]
