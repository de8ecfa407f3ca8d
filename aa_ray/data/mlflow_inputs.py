"""Datasets in MLflow: the prior data a run trained with, and the dataset a rollout wrote, logged as
MLflow dataset inputs (`mlflow.data`: name, digest, source, schema), so a run page's "Datasets" panel
names them and a pipeline's runs show what fed what (the rollout stage's dataset and the RLPD
stage's prior data carry the same digest).

MLflow records datasets as a run's inputs only (`log_outputs` takes models), so a rollout's run logs
the dataset it wrote with the context `rollout output`; a training run logs its prior data with the
context `training`.

The digest is an MD5 over the dataset's files (their names relative to the dataset and their bytes),
so it changes whenever the data does, whatever the path; hashing reads the dataset once (about a
second per GB).
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import aa_ray.data.dataset as ds
from aa_ray.data.minari_format import MinariTransitions
from aa_ray.data.sources import read_dataset

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.data.meta_dataset import MetaDataset

    from aa_ray.data.dataset import TransitionDataset

TRAINING = "training"
ROLLOUT_OUTPUT = "rollout output"
CONTEXT_TAG = "mlflow.data.context"  # mlflow.utils.mlflow_tags.MLFLOW_DATASET_CONTEXT: what the UI shows


def dataset_digest(files: list[Path], root: Path) -> str:
    """A content digest of a dataset's files (MLflow's short MD5 form)."""
    from mlflow.data.digest_utils import get_normalized_md5_digest

    parts = []
    for file in sorted(files):
        md5 = hashlib.md5(usedforsecurity=False)
        md5.update(str(file.relative_to(root) if file != root else file.name).encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                md5.update(block)
        parts.append(md5.digest())
    return get_normalized_md5_digest(parts)


def _schema(dataset: TransitionDataset | MinariTransitions) -> Any:
    """The dataset's columns as an MLflow tensor schema (names as the dataset stores them)."""
    from mlflow.types.schema import Schema, TensorSpec

    obs_dim, act_dim = dataset.meta.obs_dim, dataset.meta.act_dim
    float32, boolean, int64 = np.dtype(np.float32), np.dtype(np.bool_), np.dtype(np.int64)
    if isinstance(dataset, MinariTransitions):  # per episode: T + 1 observations, T of the rest
        observation, action = dataset.dataset.observation_space, dataset.dataset.action_space
        columns = [("observations", np.dtype(observation.dtype), (-1, obs_dim)),
                   ("actions", np.dtype(action.dtype), (-1, act_dim)), ("rewards", np.dtype(np.float64), (-1,)),
                   ("terminations", boolean, (-1,)), ("truncations", boolean, (-1,))]
    else:
        columns = [(ds.OBS, float32, (-1, obs_dim)), (ds.ACTIONS, float32, (-1, act_dim)), (ds.REWARDS, float32, (-1,)),
                   (ds.NEXT_OBS, float32, (-1, obs_dim)), (ds.TERMINATEDS, boolean, (-1,)),
                   (ds.TRUNCATEDS, boolean, (-1,)), (ds.EPS_ID, int64, (-1,)), (ds.T, int64, (-1,))]
    return Schema([TensorSpec(dtype, shape, name) for name, dtype, shape in columns])


def mlflow_dataset(path: str | Path) -> MetaDataset:
    """A Parquet or Minari dataset (`aa_ray.data.read_dataset`) as an MLflow dataset: its name (the
    Minari id, or the file or folder name), digest, local source and schema."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    path = Path(path).resolve()
    dataset = read_dataset(path)
    name = dataset.name if isinstance(dataset, MinariTransitions) else path.name
    with warnings.catch_warnings():
        # a local path matches MLflow's local artifact source twice over (file:// and no scheme)
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        source = resolve_dataset_source(str(path))
    return MetaDataset(source, name=name, digest=dataset_digest(dataset.files, path), schema=_schema(dataset))


def log_dataset(client: MlflowClient, run_id: str, path: str | Path, context: str) -> MetaDataset:
    """Log the dataset at `path` as an input of the run, with its context (`training`, `rollout output`)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    from aa_ray.tracking.mlflow_tracker import retry_locked

    dataset = mlflow_dataset(path)
    entity = Dataset(**dataset.to_dict())
    inputs = [DatasetInput(entity, tags=[InputTag(CONTEXT_TAG, context)])]
    retry_locked(lambda: client.log_inputs(run_id, datasets=inputs))
    return dataset


def log_prior_data(record: Any, path: Path) -> None:
    """A tracked run's prior dataset as its `training` input (`record`: the run's RunRecord). The
    run goes on if the store refuses it: it says so among the run's messages."""
    from mlflow.exceptions import MlflowException

    tracker = getattr(record, "mlflow", None)  # datasets are MLflow inputs: nothing where MLflow does not track it
    if tracker is None:
        return
    try:
        log_dataset(tracker.client, tracker.run_id, path, TRAINING)
    except (MlflowException, OSError, ds.DatasetError) as err:
        record.message(f"could not log the prior dataset {path} in MLflow: {str(err).splitlines()[0]}")


def track_rollout(
    client: MlflowClient, experiment: str, tags: dict[str, str], summary: dict[str, Any], params: dict[str, Any],
) -> str:
    """A finished rollout as an MLflow run: its params, `rollout/<summary number>` metrics (episodes,
    transitions, mean_return and the env's task metrics) and the dataset it wrote as its input
    (context `rollout output`). Returns the run id."""
    from mlflow.entities import Metric, Param

    from aa_ray.tracking.mlflow_tracker import retry_locked, start_run

    run_id = start_run(client, experiment, tags)
    metrics = {k: v for k, v in summary.items() if k in ("episodes", "transitions") or k.startswith("mean_")}
    retry_locked(lambda: client.log_batch(
        run_id, metrics=[Metric(f"rollout/{k}", float(v), 0, 0) for k, v in metrics.items()],
        params=[Param(k, str(v)) for k, v in params.items()],
    ))
    log_dataset(client, run_id, summary["path"], ROLLOUT_OUTPUT)
    retry_locked(lambda: client.set_terminated(run_id))
    return run_id
