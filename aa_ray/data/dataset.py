"""Transition datasets: one Parquet row per environment step, readable by pyarrow, Ray Data and RLlib.

Columns (named as RLlib's offline columnar format, `ray.rllib.core.columns.Columns`, so that
`ray.data.read_parquet` and RLlib's offline algorithms read our files as they are):

| column        | Arrow type                        | meaning                                          |
|---------------|-----------------------------------|--------------------------------------------------|
| `obs`         | fixed_size_list<float32>[obs_dim] | observation s_t                                  |
| `actions`     | fixed_size_list<float32>[act_dim] | action a_t in the policy's [-1, 1] space         |
| `rewards`     | float32                           | r_t (raw, unscaled)                              |
| `new_obs`     | fixed_size_list<float32>[obs_dim] | s_{t+1} (the true final observation at an end)   |
| `terminateds` | bool                              | s_{t+1} is terminal: masks the bootstrap         |
| `truncateds`  | bool                              | the episode was cut by a time limit: bootstraps  |
| `eps_id`      | int64                             | episode id, unique within the dataset            |
| `t`           | int64                             | step index of s_t within its episode (0, 1, ...) |

Rows are 1-step transitions and carry no discount: a reader applies its own gamma (the replay
buffer stores discount = gamma for them, whatever `n_step` the online data uses). An episode's
rows are contiguous and in `t` order. Actions are stored as the policy emits them, in [-1, 1]
per dimension; the env saw `low + (a + 1) / 2 * (high - low)` with the bounds in the metadata.

File metadata (Parquet key-value metadata, key `aa_ray.dataset`, a JSON object): `format`
("aa-ray transitions"), `format_version`, `env_id`, `env_kwargs`, `observation_space` and
`action_space` (`shape`, `low`, `high`, `dtype`; infinite bounds written as "inf"/"-inf"),
`action_encoding`, `producer` ("scripted" or a checkpoint path), `created`, and, once the
writer is closed, `num_transitions` and `num_episodes`.

Grouped (Dict) observations (`aa_ray/envs/obs_groups.py`) are stored one column per key:
`obs/<key>` and `new_obs/<key>` in place of `obs` and `new_obs`, each a fixed_size_list of that
key's features, in the order the metadata's `observation_groups` ([[key, dim], ...]) lists them;
readers get them back concatenated, as the runtime moves them.

A dataset is a single file or a folder of such files (as Ray Data writes them). Large datasets
are never loaded whole: `TransitionDataset.iter_batches` streams record batches through
`pyarrow.dataset`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aa_ray.data.value_checks import ACTION_RANGE, first_bad_value
from aa_ray.records import Transitions

if TYPE_CHECKING:
    pass

FORMAT = "aa-ray transitions"
FORMAT_VERSION = 1
META_KEY = b"aa_ray.dataset"
ACTION_ENCODING = "policy space [-1, 1]; env action = low + (a + 1) / 2 * (high - low)"

# ray.rllib.core.columns.Columns values (tests check they still match the installed Ray)
OBS, ACTIONS, REWARDS, NEXT_OBS = "obs", "actions", "rewards", "new_obs"
TERMINATEDS, TRUNCATEDS, EPS_ID, T = "terminateds", "truncateds", "eps_id", "t"
COLUMNS = (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS, TRUNCATEDS, EPS_ID, T)
# the one place the dataset's column names meet the runtime's field names (aa_ray.records.Transitions)
COLUMN_OF_FIELD = {
    "obs": OBS, "action": ACTIONS, "reward": REWARDS, "next_obs": NEXT_OBS,
    "terminated": TERMINATEDS, "truncated": TRUNCATEDS,
}
_VECTOR_COLUMNS = {OBS: "obs", ACTIONS: "act", NEXT_OBS: "obs"}  # fixed-size lists, of obs_dim or act_dim
_NUMPY_DTYPES = {REWARDS: np.float32, TERMINATEDS: np.bool_, TRUNCATEDS: np.bool_, EPS_ID: np.int64, T: np.int64}
_FLOAT_COLUMNS = (OBS, ACTIONS, REWARDS, NEXT_OBS)  # what `check_values` reads; the others cannot be non-finite


def episode_columns(transitions: Transitions, eps_id: int) -> dict[str, np.ndarray]:
    """One recorded episode's transitions (in order) as the dataset's columns."""
    columns = {column: getattr(transitions, name) for name, column in COLUMN_OF_FIELD.items()}
    columns = {column: np.asarray(values, _NUMPY_DTYPES.get(column, np.float32)) for column, values in columns.items()}
    columns[EPS_ID] = np.full(transitions.rows, eps_id, np.int64)
    columns[T] = np.arange(transitions.rows, dtype=np.int64)
    return columns


def as_transitions(batch: Mapping[str, np.ndarray], gamma: float) -> Transitions:
    """A batch of dataset rows as 1-step replay transitions (discount gamma)."""
    fields = {name: np.asarray(batch[column], np.float32) for name, column in COLUMN_OF_FIELD.items()}
    return Transitions(**fields, discount=np.full(len(batch[REWARDS]), gamma, np.float32))


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the file and what is wrong."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _bounds_to_json(values: np.ndarray) -> list[float | str]:
    return [float(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf") for v in np.asarray(values).ravel()]


@dataclass(frozen=True)
class BoxInfo:
    """A flat Box space as the file records it."""

    shape: tuple[int, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    dtype: str = "float32"

    @classmethod
    def from_space(cls, space: Any) -> BoxInfo:
        return cls(
            tuple(int(d) for d in space.shape),
            tuple(float(v) for v in np.asarray(space.low).ravel()),
            tuple(float(v) for v in np.asarray(space.high).ravel()),
            str(np.dtype(space.dtype)),
        )

    @property
    def dim(self) -> int:
        return int(np.prod(self.shape))

    def to_json(self) -> dict[str, Any]:
        low, high = _bounds_to_json(np.array(self.low)), _bounds_to_json(np.array(self.high))
        return {"shape": list(self.shape), "low": low, "high": high, "dtype": self.dtype}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BoxInfo:
        return cls(
            tuple(int(d) for d in raw["shape"]),
            tuple(float(v) for v in raw["low"]),
            tuple(float(v) for v in raw["high"]),
            str(raw.get("dtype", "float32")),
        )


@dataclass(frozen=True)
class DatasetMeta:
    """What a dataset file says about itself."""

    env_id: str
    observation_space: BoxInfo
    action_space: BoxInfo
    producer: str  # "scripted", or the checkpoint folder whose policy acted
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    created: str = ""
    num_transitions: int | None = None
    num_episodes: int | None = None
    obs_groups: tuple[tuple[str, int], ...] = ()  # a Dict observation's keys and dims, in stored order

    @classmethod
    def for_env(cls, env_id: str, obs_space: Any, act_space: Any, producer: str, **extra: Any) -> DatasetMeta:
        return cls(env_id, BoxInfo.from_space(obs_space), BoxInfo.from_space(act_space), producer, **extra)

    @property
    def obs_dim(self) -> int:
        return self.observation_space.dim

    @property
    def act_dim(self) -> int:
        return self.action_space.dim

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "format_version": self.format_version,
                "env_id": self.env_id,
                "env_kwargs": self.env_kwargs,
                "observation_space": self.observation_space.to_json(),
                "action_space": self.action_space.to_json(),
                "action_encoding": ACTION_ENCODING,
                "producer": self.producer,
                "created": self.created or _now(),
                "num_transitions": self.num_transitions,
                "num_episodes": self.num_episodes,
                **({"observation_groups": [list(group) for group in self.obs_groups]} if self.obs_groups else {}),
            }
        )

    @classmethod
    def from_json(cls, text: bytes | str, source: str) -> DatasetMeta:
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise KeyError("format")
            return cls(
                env_id=str(raw["env_id"]),
                observation_space=BoxInfo.from_json(raw["observation_space"]),
                action_space=BoxInfo.from_json(raw["action_space"]),
                producer=str(raw["producer"]),
                env_kwargs=dict(raw.get("env_kwargs") or {}),
                format_version=int(raw["format_version"]),
                created=str(raw.get("created", "")),
                num_transitions=raw.get("num_transitions"),
                num_episodes=raw.get("num_episodes"),
                obs_groups=tuple((str(key), int(dim)) for key, dim in raw.get("observation_groups") or ()),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DatasetError(f"dataset {source}: its {META_KEY.decode()} metadata is unreadable ({err!r}).") from None


# ---- writing ---------------------------------------------------------------------------------


def _file_columns(meta: DatasetMeta, name: str) -> list[tuple[str, int]]:
    """The stored columns of a logical column, with their widths (1 for a scalar column): `obs` is
    `obs/<key>` per key for grouped observations."""
    if name not in _VECTOR_COLUMNS:
        return [(name, 1)]
    if _VECTOR_COLUMNS[name] == "act":
        return [(name, meta.act_dim)]
    return [(f"{name}/{key}", dim) for key, dim in meta.obs_groups] if meta.obs_groups else [(name, meta.obs_dim)]


def _schema(meta: DatasetMeta) -> pa.Schema:
    scalars = {REWARDS: pa.float32(), TERMINATEDS: pa.bool_(), TRUNCATEDS: pa.bool_(), EPS_ID: pa.int64(),
               T: pa.int64()}
    fields = [
        (column, pa.list_(pa.float32(), dim) if name in _VECTOR_COLUMNS else scalars[name])
        for name in COLUMNS for column, dim in _file_columns(meta, name)
    ]
    return pa.schema(fields, metadata={META_KEY: meta.to_json().encode()})


def _to_table(transitions: Mapping[str, np.ndarray], meta: DatasetMeta, schema: pa.Schema) -> pa.Table:
    missing = [c for c in COLUMNS if c not in transitions]
    if missing:
        raise ValueError(f"transitions lack the dataset columns {missing}")
    n = len(transitions[REWARDS])
    arrays = []
    for name in COLUMNS:
        values = np.asarray(transitions[name])
        if name in _VECTOR_COLUMNS:
            dim = meta.obs_dim if _VECTOR_COLUMNS[name] == "obs" else meta.act_dim
            values = values.astype(np.float32, copy=False).reshape(len(values), -1)
            if values.shape != (n, dim):
                raise ValueError(f"column {name}: expected shape ({n}, {dim}), got {values.shape}")
            start = 0
            for _, width in _file_columns(meta, name):
                part = np.ascontiguousarray(values[:, start:start + width])
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), width))
                start += width
        else:
            if values.shape != (n,):
                raise ValueError(f"column {name}: expected shape ({n},), got {values.shape}")
            arrays.append(pa.array(values.astype(_NUMPY_DTYPES[name], copy=False)))
    return pa.Table.from_arrays(arrays, schema=schema)


Writer = TypeVar("Writer", bound="WholeOrNothing")


class WholeOrNothing:
    """A dataset writer as a context manager: `close()` (the dataset moved into place) when the block
    ends, `abort()` (nothing left behind) when it raises."""

    def close(self) -> Path:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: Writer) -> Writer:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class DatasetWriter(WholeOrNothing):
    """Streams transitions into one Parquet file (written to `<path>.tmp`, renamed on close, so a
    crash never leaves a half dataset under the real name). Use as a context manager."""

    def __init__(self, path: str | Path, meta: DatasetMeta):
        self.path = Path(path)
        self.meta = meta if meta.created else replace(meta, created=_now())
        self.schema = _schema(self.meta)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.writer = pq.ParquetWriter(self.tmp, self.schema)
        except (OSError, pa.ArrowException):  # it writes the file's header at once: a full disk fails here
            self.tmp.unlink(missing_ok=True)
            raise
        self.num_transitions = 0
        self.episodes: set[int] = set()

    def write(self, transitions: Mapping[str, np.ndarray]) -> None:
        table = _to_table(transitions, self.meta, self.schema)
        if table.num_rows:
            self.writer.write_table(table)
            self.num_transitions += table.num_rows
            self.episodes.update(np.unique(np.asarray(transitions[EPS_ID])).tolist())

    def close(self) -> Path:
        final = replace(self.meta, num_transitions=self.num_transitions, num_episodes=len(self.episodes))
        # the file-level key-value metadata written last wins over the schema's copy when read back
        self.writer.add_key_value_metadata({META_KEY.decode(): final.to_json()})
        self.writer.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        with contextlib.suppress(OSError, pa.ArrowException):  # closing flushes: on a full disk that fails too
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


def write_dataset(path: str | Path, transitions: Mapping[str, np.ndarray], meta: DatasetMeta) -> Path:
    """Write a whole dataset at once (`DatasetWriter` streams one chunk at a time)."""
    with DatasetWriter(path, meta) as writer:
        writer.write(transitions)
    return writer.path


# ---- reading ---------------------------------------------------------------------------------


def _data_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
        if not files:
            raise DatasetError(f"dataset folder {path} holds no .parquet files.")
        return files
    if not path.is_file():
        raise DatasetError(
            f"dataset {str(path)!r} not found: pass a Parquet file or folder written by `aa-ray rollout`."
        )
    return [path]


def _file_meta(file: Path) -> tuple[DatasetMeta, pa.Schema, int]:
    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DatasetError(f"dataset file {file} is not a Parquet file ({reason}).") from None
    raw = (parquet.metadata.metadata or {}).get(META_KEY) or (parquet.schema_arrow.metadata or {}).get(META_KEY)
    if raw is None:
        raise DatasetError(
            f"dataset file {file} is a Parquet file but not an aa-ray transition dataset "
            f"(no {META_KEY.decode()} metadata); write datasets with `aa-ray rollout` or aa_ray.data.write_dataset."
        )
    return DatasetMeta.from_json(raw, str(file)), parquet.schema_arrow, parquet.metadata.num_rows


def _check_file(file: Path, meta: DatasetMeta, schema: pa.Schema) -> None:
    if meta.format_version > FORMAT_VERSION:
        raise DatasetError(
            f"dataset file {file} has format version {meta.format_version}; this aa-ray reads up to {FORMAT_VERSION}."
        )
    stored = [column for name in COLUMNS for column, _ in _file_columns(meta, name)]
    missing = [c for c in stored if c not in schema.names]
    if missing:
        raise DatasetError(f"dataset file {file} lacks the columns {missing} (has {schema.names}).")
    if meta.obs_groups and sum(dim for _, dim in meta.obs_groups) != meta.obs_dim:
        raise DatasetError(f"dataset file {file}: its observation_groups {list(meta.obs_groups)} do not add up to "
                           f"obs_dim {meta.obs_dim}.")
    for name, kind in _VECTOR_COLUMNS.items():
        for column, dim in _file_columns(meta, name):
            column_type = schema.field(column).type
            if not (isinstance(column_type, pa.FixedSizeListType) and column_type.list_size == dim):
                raise DatasetError(
                    f"dataset file {file}: column {column} is {column_type}, but its metadata says {kind} width {dim}."
                )


@dataclass
class TransitionDataset:
    """A validated dataset (one or more files); reading it is lazy."""

    path: Path
    files: list[Path]
    meta: DatasetMeta
    num_rows: int

    def iter_batches(self, batch_rows: int = 65_536) -> Iterator[dict[str, np.ndarray]]:
        """Stream the transitions as dicts of numpy arrays (vectors as (n, dim) float32),
        at most `batch_rows` rows at a time, in file order."""
        # imported here: it imports pandas, a third of a second of CPU in every process that reads no dataset
        import pyarrow.dataset as pads

        dataset = pads.dataset([str(f) for f in self.files], format="parquet")
        columns = [column for name in COLUMNS for column, _ in _file_columns(self.meta, name)]
        for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
            if batch.num_rows:
                yield _batch_to_numpy(batch, self.meta)

    def check_values(self, batch_rows: int = 262_144) -> None:
        """Read every float column once (streamed, `batch_rows` rows at a time): DatasetError naming
        the file, the column and the first bad row for a NaN, an infinity, an empty value, or an
        action outside the policy's [-1, 1] space (`aa_ray.data.value_checks`)."""
        columns = [column for name in _FLOAT_COLUMNS for column, _ in _file_columns(self.meta, name)]
        for file in self.files:
            row = 0
            try:
                with pq.ParquetFile(file) as parquet:
                    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
                        bad = first_bad_value(batch, columns, action_columns=[ACTIONS], first_row=row)
                        if bad is not None:
                            raise DatasetError(f"dataset file {file}: {bad.describe()}{_bad_value_hint(bad.column)}")
                        row += batch.num_rows
            except (OSError, pa.ArrowException) as err:
                reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise DatasetError(f"dataset file {file} is truncated or corrupt after row {row} ({reason}).") from None

    def read_all(self) -> dict[str, np.ndarray]:
        """Every transition in memory at once (small datasets, tests)."""
        parts = list(self.iter_batches())
        if not parts:
            return _batch_to_numpy(pa.RecordBatch.from_pylist([], schema=_schema(self.meta)), self.meta)
        return {name: np.concatenate([p[name] for p in parts]) for name in COLUMNS}


def _bad_value_hint(column: str) -> str:
    """What to do about a bad value, after the sentence naming it."""
    if column == ACTIONS:
        low, high = ACTION_RANGE
        return (f"; actions are stored in the policy's [{low:g}, {high:g}] space (env action = low + (a + 1) / 2 * "
                "(high - low)), so env-scale actions must be mapped back with a = 2 * (env_action - low) / "
                "(high - low) - 1.")
    return "; one NaN or infinity in a batch makes every network update NaN: fix or drop those rows, or record " \
           "the dataset again."


def _batch_to_numpy(batch: pa.RecordBatch, meta: DatasetMeta) -> dict[str, np.ndarray]:
    out = {}
    n = batch.num_rows
    for name in COLUMNS:
        if name in _VECTOR_COLUMNS:  # a grouped observation's keys, concatenated back
            parts = [batch.column(column).flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(n, dim)
                     for column, dim in _file_columns(meta, name)]
            out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        else:
            out[name] = batch.column(name).to_numpy(zero_copy_only=False).astype(_NUMPY_DTYPES[name])
    return out


def dataset_meta(spec: Any, producer: str) -> DatasetMeta:
    """The metadata of a dataset recorded on the spec's env (its spaces, kwargs and observation groups)
    by `producer` (a checkpoint, a scripted controller)."""
    from aa_ray.envs import make_vector_env, vector_obs_dims

    envs = make_vector_env(spec, 1)
    try:
        return DatasetMeta.for_env(
            spec.env.id,
            envs.single_observation_space,
            envs.single_action_space,
            producer,
            env_kwargs=dict(spec.env.kwargs),
            obs_groups=vector_obs_dims(envs).groups,
        )
    finally:
        envs.close()


def read_parquet(
    path: str | Path,
    expect_env_id: str | None = None,
    expect_obs_dim: int | None = None,
    expect_act_dim: int | None = None,
) -> TransitionDataset:
    """Open and validate a Parquet dataset, a file or a folder of them (reading only file footers).
    Raises DatasetError naming the file and the mismatch when it is not a dataset, lacks columns, or
    was recorded on another env or with other observation/action dimensions than expected. (Any
    format: `aa_ray.data.sources.read_dataset`.)"""
    path = Path(path)
    files = _data_files(path)
    metas, num_rows = [], 0
    for file in files:
        meta, schema, rows = _file_meta(file)
        _check_file(file, meta, schema)
        _check_expected(file, meta, expect_env_id, expect_obs_dim, expect_act_dim)
        if metas and (meta.env_id, meta.obs_dim, meta.act_dim) != (metas[0].env_id, metas[0].obs_dim, metas[0].act_dim):
            raise DatasetError(f"dataset {path}: file {file} was recorded on another env or with other dims.")
        metas.append(meta)
        num_rows += rows
    if num_rows == 0:
        raise DatasetError(f"dataset {path} holds no transitions.")
    return TransitionDataset(path, files, metas[0], num_rows)


def _check_expected(
    file: Path, meta: DatasetMeta, env_id: str | None, obs_dim: int | None, act_dim: int | None
) -> None:
    if env_id is not None and meta.env_id != env_id:
        raise DatasetError(f"dataset {file} was recorded on env {meta.env_id!r}, but this run's env is {env_id!r}.")
    if obs_dim is not None and meta.obs_dim != obs_dim:
        raise DatasetError(
            f"dataset {file} holds observations of dim {meta.obs_dim}, but this run's env has obs_dim {obs_dim}."
        )
    if act_dim is not None and meta.act_dim != act_dim:
        raise DatasetError(
            f"dataset {file} holds actions of dim {meta.act_dim}, but this run's env has act_dim {act_dim}."
        )
