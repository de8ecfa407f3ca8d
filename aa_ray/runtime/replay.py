"""A ring buffer of transitions in preallocated numpy arrays, with Parquet save/load, and an
optional prior buffer of dataset transitions for RLPD."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

import aa_ray.data.dataset as ds
from aa_ray import seeding
from aa_ray.data.sources import read_dataset
from aa_ray.records import (
    PackedTransitions,
    PriorData,
    ReplaySample,
    SampleTiming,
    Transitions,
    prior_rows,  # the one definition, shared with the algorithms' diagnostics
)
from aa_ray.runtime.metrics import RunMetrics

FIELDS = Transitions._fields

__all__ = ["FIELDS", "ReplayBuffer", "join_shards", "prior_rows", "split_shards"]

SHARDS_KEY = b"aa_ray.shards"  # a joined table's metadata: each replay shard's [rows, cursor], in shard order


class ReplayBuffer:
    """Uniform-sampling FIFO replay; capacity counted in transitions.

    `add` takes the `Transitions` env runners return; `sample` returns stacks of batches shaped
    (num_batches, batch_size, ...) so a learner gets a whole iteration's data in one message.

    RLPD: after `load_prior`, every sampled batch is `[prior rows | online rows]`: its first
    `prior_rows(batch_size, ratio)` rows are drawn uniformly from the prior dataset, the rest
    uniformly from the online ring (symmetric sampling when ratio is 0.5). The prior buffer is
    never evicted, and is not saved with checkpoints (a resumed run reloads it from the dataset).
    """

    def __init__(
        self, capacity: int, obs_dim: int, act_dim: int, seed: int, run: str | None = None,
        obs_groups: tuple[tuple[str, int], ...] = (), shard: int = 0,
    ):
        """`seed` is the spec's seed: the buffer samples from its own stream of it (`seeding.replay_rng`;
        replay shard `shard` > 0 from a stream of its own). `obs_groups`: a Dict observation's (key,
        features) in the order the flat observation holds them (`aa_ray.envs.obs_groups`); the saved
        table keeps one column per key."""
        self.capacity = capacity
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.obs_groups = tuple(obs_groups)
        # one row per transition, its fields side by side: a sample is one gather of whole rows and
        # travels as one array; `storage` views the same memory field by field
        self.rows = PackedTransitions.empty(capacity, obs_dim, act_dim)
        self.storage = self.rows.unpack()
        self.cursor = 0  # next write position
        self.size = 0
        self.total_added = 0
        self.seed, self.shard = seed, shard
        self.rng = seeding.replay_rng(seed, shard)
        self.prior: ReplayBuffer | None = None
        self.prior_ratio = 0.0
        self.metrics = RunMetrics(run, shard=shard) if run else None  # Ray metrics, when the buffer is a run's actor

    def __len__(self) -> int:
        return self.size

    def add(self, *chunks: Transitions) -> int:
        """Append chunks in order; returns the new size."""
        for chunk in chunks:
            n = chunk.rows
            if n == 0:
                continue
            if n > self.capacity:  # only the newest `capacity` transitions can survive anyway
                chunk = chunk.take(slice(-self.capacity, None))
                n = self.capacity
            index = (self.cursor + np.arange(n)) % self.capacity
            for stored, new in zip(self.storage, chunk, strict=True):
                stored[index] = new
            self.cursor = (self.cursor + n) % self.capacity
            self.size = min(self.size + n, self.capacity)
            self.total_added += n
        if self.metrics is not None:
            self.metrics.set("aa_ray_replay_size", self.size)
        return self.size

    def sample(self, num_batches: int, batch_size: int) -> Transitions:
        """(num_batches, batch_size) transitions, field by field (views of one packed sample)."""
        return self.sample_packed(num_batches, batch_size).unpack()

    def sample_packed(self, num_batches: int, batch_size: int) -> PackedTransitions:
        n_prior = prior_rows(batch_size, self.prior_ratio) if self.prior is not None else 0
        return self._sample_rows(num_batches, n_prior, batch_size - n_prior)

    def _sample_rows(self, num_batches: int, n_prior: int, n_online: int) -> PackedTransitions:
        """Batches of `n_prior` rows of the prior dataset, then `n_online` rows of the ring."""
        if self.metrics is not None:
            self.metrics.inc("aa_ray_replay_sampled", num_batches * (n_prior + n_online))
        if self.prior is None:
            if n_prior:
                raise RuntimeError(f"replay shard {self.shard} holds no prior dataset to draw {n_prior} rows from")
            return self._draw(num_batches, n_online)
        prior = self.prior._draw(num_batches, n_prior, rng=self.rng)
        online = self._draw(num_batches, n_online)
        return PackedTransitions.concat([prior, online], axis=1)

    def sample_for_learners(
        self, num_batches: int, batch_size: int, num_learners: int
    ) -> ReplaySample | tuple[ReplaySample, ...]:
        """What the learners train on, from the one replay buffer: a global batch as `num_learners`
        equal shards, one per learner, each its own object so a learner fetches only its rows, each
        keeping the `[prior | online]` layout at the ratio (see `sample_part`)."""
        rows = batch_size // num_learners
        n_prior = prior_rows(rows, self.prior_ratio) if self.prior is not None else 0
        return self.sample_part(num_batches, n_prior, rows - n_prior, num_learners)

    def sample_part(
        self, num_batches: int, n_prior: int, n_online: int, num_learners: int
    ) -> ReplaySample | tuple[ReplaySample, ...]:
        """For each of `num_learners`, batches of `n_prior` prior rows (the buffer, or the replay shard,
        that holds the dataset) then `n_online` rows of this buffer's ring, with how long sampling took
        and when it was done beside them, for the learners' time/* phases. With `runtime.replay_shards`
        this is one shard's part of every learner's sample: a learner lays the shards' parts side by side
        (`learner.DeviceFeed`), so its batch keeps the `[prior | online]` layout."""
        start = time.perf_counter()
        parts = [self._sample_rows(num_batches, n_prior, n_online) for _ in range(num_learners)]
        timing = SampleTiming(sample_s=(time.perf_counter() - start) / num_learners, sampled_at=time.time())
        samples = tuple(ReplaySample(part, timing) for part in parts)
        return samples[0] if num_learners == 1 else samples

    def _draw(self, num_batches: int, batch_size: int, rng: np.random.Generator | None = None) -> Transitions:
        if self.size == 0 and batch_size > 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        index = (rng or self.rng).integers(0, max(self.size, 1), size=(num_batches, batch_size))
        return self.rows.take(index)

    def load_prior(self, path: str | Path, ratio: float, gamma: float, env_id: str) -> PriorData:
        """Load a transition dataset (validated against env_id and this buffer's dims) into the prior
        buffer, streaming it batch by batch. Its 1-step rows get discount = gamma. Returns the row
        count and the moments of its observations (for the observation normalizer)."""
        dataset = read_dataset(path, expect_env_id=env_id, expect_obs_dim=self.obs_dim, expect_act_dim=self.act_dim)
        # the prior buffer is drawn from with this buffer's generator (see `sample`), never its own
        self.prior = ReplayBuffer(dataset.num_rows, self.obs_dim, self.act_dim, seed=self.seed)
        self.prior_ratio = ratio
        total, total_sq = np.zeros(self.obs_dim), np.zeros(self.obs_dim)
        for batch in dataset.iter_batches():
            transitions = ds.as_transitions(batch, gamma)
            self.prior.add(transitions)
            obs = transitions.obs
            total += obs.sum(0, dtype=np.float64)
            total_sq += np.square(obs, dtype=np.float64).sum(0)
        n = len(self.prior)
        mean = total / n
        return PriorData(rows=n, obs=(n, mean, np.maximum(total_sq / n - mean**2, 0.0)))

    def state(self) -> dict:
        return {
            "cursor": self.cursor,
            "size": self.size,
            "total_added": self.total_added,
            "rng": self.rng.bit_generator.state,
        }

    def to_table(self) -> pa.Table:
        """The stored transitions as an Arrow table (one row per slot, in storage order) for the
        driver to write into a checkpoint, so that a reload (with `state()`) samples exactly the
        same batches. The driver writes it because this actor may live on another node."""
        columns = {}
        for name, stored in zip(FIELDS, self.storage, strict=True):
            data = np.ascontiguousarray(stored[: self.size])  # a field's column of the packed rows
            for column, part in self._stored_columns(name, data):
                if part.ndim == 2:
                    columns[column] = pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), part.shape[1])
                else:
                    columns[column] = pa.array(part)
        table = pa.table(columns)
        meta = {
            b"aa_ray.replay": f"{self.obs_dim},{self.act_dim}".encode(),
            b"aa_ray.cursor": str(self.cursor).encode(),
        }
        return table.replace_schema_metadata(meta)

    def _stored_columns(self, name: str, data: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """The table columns of a field: one, or for grouped observations one per key (`obs/proprio`, ...)."""
        if name not in ("obs", "next_obs") or not self.obs_groups:
            return [(name, data)]
        columns, start = [], 0
        for key, dim in self.obs_groups:
            columns.append((f"{name}/{key}", data[:, start:start + dim]))
            start += dim
        return columns

    def load_table(self, table: pa.Table, state: dict | None = None, source: str = "replay table") -> None:
        """Refill the buffer from `to_table()`'s output (read from `source`, named in errors)."""
        dims = (table.schema.metadata or {}).get(b"aa_ray.replay", b"").decode()
        if dims != f"{self.obs_dim},{self.act_dim}":
            raise ValueError(
                f"replay file {source} holds obs/action dims {dims or 'unknown'}, "
                f"this run needs {self.obs_dim},{self.act_dim}"
            )
        n = table.num_rows
        if n > self.capacity:
            raise ValueError(f"replay file {source} holds {n} transitions, more than the capacity {self.capacity}")
        for name, stored in zip(FIELDS, self.storage, strict=True):
            parts = []
            for column_name, _ in self._stored_columns(name, stored[:0]):
                column = table.column(column_name).combine_chunks()
                if isinstance(column.type, pa.FixedSizeListType):
                    parts.append(column.flatten().to_numpy().reshape(n, column.type.list_size))
                else:
                    parts.append(column.to_numpy())
            stored[:n] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        self.size = self.total_added = n
        self.cursor = int(table.schema.metadata.get(b"aa_ray.cursor", str(n % self.capacity).encode()))
        if state is not None:
            self.total_added = int(state["total_added"])
            self.rng.bit_generator.state = state["rng"]


def join_shards(tables: Sequence[pa.Table]) -> pa.Table:
    """Replay shards' tables as one (a checkpoint has one replay file; their states go in a list): the
    shards' rows one after another, each shard's row count and cursor in the table's metadata. One
    shard's table is returned as it is (the format of one buffer)."""
    if len(tables) == 1:
        return tables[0]
    meta = dict(tables[0].schema.metadata)
    meta[SHARDS_KEY] = json.dumps([[t.num_rows, int(t.schema.metadata[b"aa_ray.cursor"])] for t in tables]).encode()
    joined = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
    return joined.replace_schema_metadata(meta)


def split_shards(table: pa.Table, state: dict, shards: int) -> tuple[list[pa.Table], list[dict | None]]:
    """`join_shards` undone for `shards` replay shards: each shard's rows, cursor and state as it wrote
    them when the checkpoint has that many. Otherwise (the run changed runtime.replay_shards) the rows
    are dealt out in even contiguous parts and every shard samples from a fresh stream: the run goes on
    with every stored transition, though no longer as the uninterrupted run would have."""
    meta = dict(table.schema.metadata or {})
    cursor = meta.get(b"aa_ray.cursor")
    layout = json.loads(meta.pop(SHARDS_KEY)) if SHARDS_KEY in meta else [[table.num_rows, cursor and int(cursor)]]
    saved_states = state.get("shards", [state]) if state else [None] * len(layout)
    if len(layout) != shards:
        meta.pop(b"aa_ray.cursor", None)  # each part's cursor is its row count (load_table's default)
        bounds = [table.num_rows * shard // shards for shard in range(shards + 1)]
        layout = [[stop - start, None] for start, stop in zip(bounds, bounds[1:], strict=False)]
        saved_states = [None] * shards
    parts, start = [], 0
    for rows, cursor in layout:
        part_meta = {**meta, **({b"aa_ray.cursor": str(cursor).encode()} if cursor is not None else {})}
        parts.append(table.slice(start, rows).replace_schema_metadata(part_meta))
        start += rows
    return parts, list(saved_states)
