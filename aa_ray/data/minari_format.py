"""Minari datasets (the Farama Foundation's offline-RL format, D4RL's successor) in and out, through
the `minari` package's own writer and reader.

Writing (`aa-ray rollout --format minari`): episodes go into `minari.create_dataset_from_buffers`
and then `MinariDataset.update_dataset_from_buffer` one round at a time, in Minari's `arrow` data
format (pyarrow is already a dependency; `hdf5` would add h5py). A dataset lives at
`<root>/<dataset id>/`, where root is the folder given (`--out`) or `MINARI_DATASETS_PATH`, never
the user's home by default; `MINARI_DATASETS_PATH=<root>` then lets `minari.load_dataset(id)` open
it. It is written under a staging folder inside the root and moved into place once complete, so a
failed rollout leaves no half dataset under its id.

What is stored, in Minari's own terms: per episode `observations` (T + 1 rows: s_0 .. s_T, the last
the true final observation), `actions`, `rewards`, `terminations` and `truncations` (T rows, kept
apart: a termination masks the bootstrap, a truncation does not). Actions are in the env's action
space (what Minari datasets hold, e.g. D4RL's): the policy's [-1, 1] actions are mapped with
`low + (a + 1) / 2 * (high - low)` on the way out and back with `2 * (x - low) / (high - low) - 1`
on the way in. The metadata holds the gymnasium env spec (with the spec's kwargs) where it can be
serialized (an env given by a Python callable cannot be), the observation and action spaces,
`algorithm_name` (the producer: "scripted" or the checkpoint folder) and an `aa_ray` entry (env
id, env kwargs, producer, action encoding).

Reading (`algo.prior_data`: a dataset folder, its `data/` folder, or a dataset id under
`MINARI_DATASETS_PATH` / Minari's default root): `minari.MinariDataset` streams episodes; each
becomes 1-step transitions in the dataset module's columns, so the replay buffer loads it as it
loads Parquet. Only flat Box observations are supported (grouped Dict observations: use Parquet).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

import aa_ray.data.dataset as ds
from aa_ray.data.value_checks import ACTION_RANGE, first_bad_value
from aa_ray.errors import echo

if TYPE_CHECKING:
    import gymnasium as gym
    from gymnasium.envs.registration import EnvSpec
    from minari import MinariDataset

FORMAT = "minari"
DATA_FORMAT = "arrow"
ROOT_ENV = "MINARI_DATASETS_PATH"
METADATA_KEY = "aa_ray"
ACTION_ENCODING = "env action space (policy action a in [-1, 1] stored as low + (a + 1) / 2 * (high - low))"
# float32 rounding of the env-scale mapping there and back may land a hair outside [-1, 1]
ACTION_ROUNDING = 1e-5


def is_minari_folder(path: Path) -> bool:
    """A Minari dataset folder (holding `data/metadata.json`)."""
    return (path / "data" / "metadata.json").is_file()


def default_root() -> Path:
    """Where `minari.load_dataset` looks for ids: MINARI_DATASETS_PATH, else Minari's default.
    (Minari's own `get_dataset_path` creates that folder as a side effect; looking must not.)"""
    return Path(os.environ.get(ROOT_ENV) or Path.home() / ".minari" / "datasets")


def valid_dataset_id(dataset_id: str) -> bool:
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except ValueError:
        return False
    return True


def resolve(value: str | Path) -> Path | None:
    """The Minari dataset folder `value` names: a dataset folder, its `data/` folder, or a dataset id
    found under `default_root()`; None when it names none (it may still be a Parquet dataset)."""
    path = Path(value).expanduser()
    if path.name == "data" and is_minari_folder(path.parent):
        return path.parent.resolve()
    if is_minari_folder(path):
        return path.resolve()
    if not path.is_absolute() and valid_dataset_id(str(value)) and is_minari_folder(default_root() / str(value)):
        return (default_root() / str(value)).resolve()
    return None


def missing_hint(value: str) -> str:
    """What a prior_data value that names nothing could have meant, for its error message."""
    if valid_dataset_id(value) and not value.endswith(".parquet"):
        return f" nor a Minari dataset id under {default_root()} (set {ROOT_ENV} to the folder holding it)"
    return ""


def box(info: ds.BoxInfo) -> gym.spaces.Box:
    """The gymnasium Box a dataset's BoxInfo describes (infinite bounds included)."""
    import gymnasium as gym

    dtype = np.dtype(info.dtype)
    low = np.asarray(info.low, dtype=dtype).reshape(info.shape)
    high = np.asarray(info.high, dtype=dtype).reshape(info.shape)
    return gym.spaces.Box(low, high, info.shape, dtype=dtype)


def recorded_env_spec(spec: Any) -> EnvSpec | None:
    """The gymnasium EnvSpec a dataset records for the spec's env, with its kwargs and time limit;
    None for an env given by a callable entry point (an EnvSpec that cannot be serialized)."""
    import gymnasium as gym

    from aa_ray.envs.make import env_kwargs
    from aa_ray.envs.source import make_target

    target = make_target(spec.env)
    base = gym.spec(target) if isinstance(target, str) else target
    kwargs = env_kwargs(spec)
    limit = kwargs.pop("max_episode_steps", base.max_episode_steps)
    env_spec = replace(base, kwargs={**base.kwargs, **kwargs}, max_episode_steps=limit)
    try:
        env_spec.to_json()
    except (TypeError, ValueError):
        return None
    return env_spec


# ---- writing ---------------------------------------------------------------------------------


@contextmanager
def _datasets_root(root: Path) -> Iterator[None]:
    """Point Minari's creation functions (which take an id, not a path) at `root` for the call."""
    before = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ROOT_ENV, None)
        else:
            os.environ[ROOT_ENV] = before


def check_target(root: Path, dataset_id: str) -> Path:
    """The folder a new dataset `dataset_id` will take under `root`: DatasetError for an id Minari
    refuses or a dataset already there (Minari never overwrites one)."""
    if not valid_dataset_id(dataset_id):
        raise ds.DatasetError(
            f"Minari dataset id {dataset_id!r} is malformed: Minari ids are (namespace/)name-v<version>, "
            "e.g. pusher-reach/scripted-v0."
        )
    final = root / dataset_id
    if final.exists():
        raise ds.DatasetError(
            f"a Minari dataset {dataset_id!r} already exists at {final}: pick another id (or version), "
            "or remove it first."
        )
    return final


def _split_episodes(columns: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Dataset rows (whole episodes, contiguous, in step order) as Minari episodes."""
    eps_id = np.asarray(columns[ds.EPS_ID])
    starts = np.flatnonzero(np.r_[True, eps_id[1:] != eps_id[:-1]])
    ends = np.r_[starts[1:], len(eps_id)]
    episodes = []
    for start, end in zip(starts, ends, strict=True):
        rows = {name: np.asarray(values)[start:end] for name, values in columns.items()}
        obs, next_obs = rows[ds.OBS], rows[ds.NEXT_OBS]
        if not np.array_equal(obs[1:], next_obs[:-1]):  # a Minari episode stores each observation once
            raise ValueError(f"episode {eps_id[start]}: its rows are not one contiguous episode")
        episodes.append({
            "observations": np.concatenate([obs, next_obs[-1:]]),
            "actions": rows[ds.ACTIONS],
            "rewards": rows[ds.REWARDS],
            "terminations": rows[ds.TERMINATEDS],
            "truncations": rows[ds.TRUNCATEDS],
        })
    return episodes


class MinariWriter(ds.WholeOrNothing):
    """Streams whole episodes (the dataset module's columns, policy-space actions) into a new
    Minari dataset `<root>/<dataset_id>`. The same interface as `DatasetWriter`: write, close
    (returns the dataset folder), abort, and a context manager that aborts on an error."""

    def __init__(self, root: str | Path, dataset_id: str, meta: ds.DatasetMeta, env_spec: EnvSpec | None = None):
        if meta.obs_groups:
            raise ds.DatasetError(
                f"env {meta.env_id} has grouped (Dict) observations ({', '.join(k for k, _ in meta.obs_groups)}); "
                "Minari output records flat Box observations only: write this dataset as Parquet."
            )
        self.root = Path(root).expanduser().resolve()
        self.dataset_id = dataset_id
        self.path = check_target(self.root, dataset_id)
        self.meta = meta
        self.env_spec = env_spec
        self.observation_space, self.action_space = box(meta.observation_space), box(meta.action_space)
        self.act_low = np.asarray(self.action_space.low, np.float64).reshape(-1)
        self.act_high = np.asarray(self.action_space.high, np.float64).reshape(-1)
        if not (np.isfinite(self.act_low).all() and np.isfinite(self.act_high).all()):
            raise ds.DatasetError(f"env {meta.env_id}'s action space {self.action_space} is unbounded: "
                                  "policy actions in [-1, 1] cannot be mapped onto it.")
        # the folders this writer makes: an aborted write removes them again (when still empty)
        self.made = [folder for folder in (self.root, *self.root.parents) if not folder.exists()]
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=".aa-ray-staging-", dir=self.root))
        self.dataset: MinariDataset | None = None
        self.num_transitions = 0
        self.num_episodes = 0

    def _buffers(self, columns: Mapping[str, np.ndarray]) -> list[Any]:
        from minari.data_collector import EpisodeBuffer

        from aa_ray.nets.policy import to_bounds

        buffers = []
        for episode in _split_episodes(columns):
            actions = to_bounds(episode["actions"].astype(np.float64), self.act_low, self.act_high)
            # id None: Minari numbers episodes 0, 1, ... in the order they are written
            buffers.append(EpisodeBuffer(
                observations=episode["observations"].astype(self.observation_space.dtype),
                actions=actions.astype(self.action_space.dtype),
                rewards=episode["rewards"].astype(np.float64),
                terminations=episode["terminations"].astype(bool),
                truncations=episode["truncations"].astype(bool),
            ))
        return buffers

    def write(self, columns: Mapping[str, np.ndarray]) -> None:
        if len(columns[ds.REWARDS]) == 0:
            return
        buffers = self._buffers(columns)
        if self.dataset is None:
            self.dataset = self._create(buffers)
        else:
            self.dataset.update_dataset_from_buffer(buffers)
        self.num_transitions += len(columns[ds.REWARDS])
        self.num_episodes += len(buffers)

    def _create(self, buffers: list[Any]) -> MinariDataset:
        import minari

        with _datasets_root(self.staging), warnings.catch_warnings():
            # what aa-ray does not know (author, e-mail, code permalink, a separate eval env) is left out on purpose
            warnings.filterwarnings("ignore", message=r"`\w+` is set to None", category=UserWarning)
            warnings.filterwarnings("ignore", message=r"env_spec is None", category=UserWarning)
            dataset = minari.create_dataset_from_buffers(
                self.dataset_id, buffers, env=self.env_spec, observation_space=self.observation_space,
                action_space=self.action_space, algorithm_name=self.meta.producer, data_format=DATA_FORMAT,
                description=f"aa-ray rollout of {self.meta.env_id} ({self.meta.producer}); actions in the env's "
                            "action space, terminations and truncations kept apart.",
            )
        dataset.storage.update_metadata({METADATA_KEY: {
            "env_id": self.meta.env_id, "env_kwargs": self.meta.env_kwargs, "producer": self.meta.producer,
            "action_encoding": ACTION_ENCODING, "created": self.meta.created or ds._now(),
        }})
        return dataset

    def close(self) -> Path:
        from minari.namespace import create_namespace, list_local_namespaces

        if self.dataset is None:
            self.dataset = self._create([])
        namespace = self.dataset_id.rpartition("/")[0]
        with _datasets_root(self.root):
            if namespace and namespace not in list_local_namespaces():  # so `minari list local` shows it
                create_namespace(namespace)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.staging / self.dataset_id, self.path)
        shutil.rmtree(self.staging, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        for folder in self.made:  # deepest first
            with contextlib.suppress(OSError):  # not empty: someone else's files are there now
                folder.rmdir()


# ---- reading ---------------------------------------------------------------------------------


def _space_summary(space: Any) -> str:
    if hasattr(space, "low") and hasattr(space, "high"):
        low, high = np.asarray(space.low).ravel(), np.asarray(space.high).ravel()
        bounds = f"[{low.min():g}, {high.max():g}]" if low.size else "[]"
        per_dim = "" if np.all(low == low[0]) and np.all(high == high[0]) else " (per-dimension bounds)"
        return f"Box{bounds}{per_dim} of shape {tuple(space.shape)}"
    return type(space).__name__


def _same_box(space: Any, info: ds.BoxInfo) -> bool:
    import gymnasium as gym

    if not isinstance(space, gym.spaces.Box) or tuple(space.shape) != info.shape:
        return False
    low, high = np.asarray(space.low, np.float64).ravel(), np.asarray(space.high, np.float64).ravel()
    return bool(np.allclose(low, info.low, rtol=1e-6, atol=1e-6) and np.allclose(high, info.high, rtol=1e-6, atol=1e-6))


@dataclass
class MinariTransitions:
    """A Minari dataset read as 1-step transitions: the interface of `TransitionDataset`
    (meta, num_rows, iter_batches, check_values, read_all), so the replay buffer loads it alike."""

    path: Path
    dataset: MinariDataset
    meta: ds.DatasetMeta
    num_rows: int

    @property
    def files(self) -> list[Path]:
        return sorted(p for p in (self.path / "data").rglob("*") if p.is_file())

    @property
    def name(self) -> str:
        return self.dataset.spec.dataset_id

    def describe(self) -> str:
        return f"Minari dataset {self.name} ({self.path})"

    def check_spaces(self, env_id: str, observation_space: ds.BoxInfo, action_space: ds.BoxInfo) -> None:
        """DatasetError, one message naming the dataset and each space that does not match the env's."""
        wrong = []
        for what, stored, env in (("observation", self.dataset.observation_space, observation_space),
                                  ("action", self.dataset.action_space, action_space)):
            if not _same_box(stored, env):
                wrong.append(f"its {what} space is {_space_summary(stored)}, the env's is {_space_summary(box(env))}")
        if wrong:
            raise ds.DatasetError(f"{self.describe()} does not fit env {env_id}: {'; '.join(wrong)}.")

    def _episodes(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(episode id, its transitions in the dataset module's columns, actions mapped back to [-1, 1]
        but not clipped)."""
        from aa_ray.nets.policy import from_bounds

        low = np.asarray(self.dataset.action_space.low, np.float64).reshape(-1)
        high = np.asarray(self.dataset.action_space.high, np.float64).reshape(-1)
        for episode in self.dataset.iterate_episodes():
            steps = len(episode.rewards)
            observations = np.asarray(episode.observations, np.float32).reshape(steps + 1, -1)
            actions = np.asarray(episode.actions, np.float64).reshape(steps, -1)
            yield int(episode.id), {
                ds.OBS: observations[:-1],
                ds.ACTIONS: from_bounds(actions, low, high).astype(np.float32),
                ds.REWARDS: np.asarray(episode.rewards, np.float32),
                ds.NEXT_OBS: observations[1:],
                ds.TERMINATEDS: np.asarray(episode.terminations, bool),
                ds.TRUNCATEDS: np.asarray(episode.truncations, bool),
                ds.EPS_ID: np.full(steps, int(episode.id), np.int64),
                ds.T: np.arange(steps, dtype=np.int64),
            }

    def iter_batches(self, batch_rows: int = 65_536) -> Iterator[dict[str, np.ndarray]]:
        """Whole episodes as the dataset module's columns, about `batch_rows` rows at a time."""
        pending: list[dict[str, np.ndarray]] = []
        rows = 0
        for _, columns in self._episodes():
            columns[ds.ACTIONS] = np.clip(columns[ds.ACTIONS], *ACTION_RANGE)  # rounding only: check_values ran
            pending.append(columns)
            rows += len(columns[ds.REWARDS])
            if rows >= batch_rows:
                yield _concatenate(pending)
                pending, rows = [], 0
        if pending:
            yield _concatenate(pending)

    def check_values(self) -> None:
        """The Parquet datasets' value checks (`aa_ray.data.value_checks`), episode by episode: a NaN,
        an infinity, or an action outside the env's action space is one DatasetError naming the
        dataset, the episode and the step."""
        for episode_id, columns in self._episodes():
            actions = columns[ds.ACTIONS]
            near = np.abs(actions) <= ACTION_RANGE[1] + ACTION_ROUNDING
            columns[ds.ACTIONS] = np.where(near, np.clip(actions, *ACTION_RANGE), actions)
            table = pa.table({name: _arrow(columns[name]) for name in (ds.OBS, ds.ACTIONS, ds.REWARDS, ds.NEXT_OBS)})
            bad = first_bad_value(table, table.column_names, action_columns=[ds.ACTIONS])
            if bad is not None:
                where = f"episode {episode_id}, step {bad.row}"
                stored = "observations" if bad.column in (ds.OBS, ds.NEXT_OBS) else bad.column
                hint = (f" (mapped from the env's action space {_space_summary(self.dataset.action_space)})"
                        if bad.column == ds.ACTIONS else "")
                raise ds.DatasetError(f"{self.describe()}: {where}: {stored} holds {bad.problem}{hint}; one "
                                      "bad value makes every network update NaN or trains on impossible actions.")

    def read_all(self) -> dict[str, np.ndarray]:
        return _concatenate([columns for _, columns in self._episodes()])


def _arrow(values: np.ndarray) -> pa.Array:
    if values.ndim == 1:
        return pa.array(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(values).reshape(-1)), values.shape[1])


def _concatenate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([part[name] for part in parts]) for name in ds.COLUMNS}


METADATA_LIMIT = 16 * 2**20  # far above any real metadata.json (a few kB); read whole before parsing


def _json_object(text: Any) -> dict[str, Any]:
    """The JSON object a metadata string holds ({} for anything else)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


def _check_metadata(path: Path) -> None:
    """Refuse, before minari opens it, a dataset whose `data/metadata.json` is not a JSON object or
    lacks either space. Minari fills a missing space in by making the env its `env_spec` records,
    and making an env imports and calls whatever that spec's entry point names: a dataset is data
    from whoever wrote it, and reading one must run no code (`aa_ray.spec.trust`). aa-ray's and
    Minari's own writers always record both spaces."""
    file = path / "data" / "metadata.json"
    try:
        if file.stat().st_size > METADATA_LIMIT:
            raise ds.DatasetError(f"Minari dataset {path}: {file} is {file.stat().st_size:,} bytes, not a dataset's "
                                  "metadata.")
        metadata = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ds.DatasetError(f"Minari dataset {path}: {file} cannot be read as JSON ({err}).") from None
    if not isinstance(metadata, dict):
        raise ds.DatasetError(f"Minari dataset {path}: {file} holds a JSON {type(metadata).__name__}, not the "
                              "object of a Minari dataset's metadata.")
    missing = [key for key in ("observation_space", "action_space") if key not in metadata]
    if missing:
        recorded = _json_object(metadata.get("env_spec"))
        entry_point = recorded.get("entry_point", "?")
        raise ds.DatasetError(
            f"Minari dataset {path}: {file} records no {' and no '.join(missing)}. minari would make the env its "
            f"env_spec records to find them, which imports and runs its entry point ({echo(entry_point)}); "
            "aa-ray reads datasets without making any env, so it reads only datasets that record both spaces "
            "(every dataset minari or aa-ray writes does). Re-create the dataset with both spaces recorded."
        )


def read_minari(
    path: Path, expect_env_id: str | None = None, expect_obs_dim: int | None = None, expect_act_dim: int | None = None,
) -> MinariTransitions:
    """Open a Minari dataset folder with `minari.MinariDataset`, as `read_dataset` opens Parquet:
    DatasetError naming it when Minari cannot read it, or its env or dims are not the expected."""
    import gymnasium as gym
    from minari import MinariDataset

    _check_metadata(path)
    try:
        dataset = MinariDataset(path / "data")
    except Exception as err:  # minari's reader checks with asserts, KeyErrors, TypeErrors...: any is a bad file
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ds.DatasetError(f"Minari dataset {path}: minari cannot read it ({reason}).") from None
    described = f"Minari dataset {dataset.spec.dataset_id} ({path})"
    for what, space in (("observation", dataset.observation_space), ("action", dataset.action_space)):
        if not isinstance(space, gym.spaces.Box):
            raise ds.DatasetError(f"{described} has a {type(space).__name__} {what} space; aa-ray reads Box "
                                  f"{what}s (flat vectors) from Minari datasets.")
    extra = dataset.storage.metadata.get(METADATA_KEY) or {}
    env_id = dataset.env_spec.id if dataset.env_spec is not None else str(extra.get("env_id", ""))
    meta = ds.DatasetMeta.for_env(
        env_id, dataset.observation_space, dataset.action_space,
        producer=str(extra.get("producer") or dataset.storage.metadata.get("algorithm_name") or "unknown"),
        env_kwargs=dict(extra.get("env_kwargs") or {}), num_transitions=int(dataset.total_steps),
        num_episodes=int(dataset.total_episodes),
    )
    if expect_env_id is not None and env_id and env_id != expect_env_id:
        raise ds.DatasetError(f"{described} was recorded on env {env_id!r}, but this run's env is {expect_env_id!r}.")
    if expect_obs_dim is not None and meta.obs_dim != expect_obs_dim:
        raise ds.DatasetError(f"{described} holds observations of dim {meta.obs_dim}, but this run's env has "
                              f"obs_dim {expect_obs_dim}.")
    if expect_act_dim is not None and meta.act_dim != expect_act_dim:
        raise ds.DatasetError(f"{described} holds actions of dim {meta.act_dim}, but this run's env has "
                              f"act_dim {expect_act_dim}.")
    if dataset.total_steps == 0:
        raise ds.DatasetError(f"{described} holds no transitions.")
    return MinariTransitions(path, dataset, meta, int(dataset.total_steps))
