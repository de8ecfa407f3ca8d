"""A run's policy as an MLflow Model: what `mlflow.pyfunc.load_model`, `mlflow.pytorch.load_model`,
`mlflow models serve` and MLflow's model registry know.

One model folder, made with MLflow's model API, holds two flavors of the same policy (observation
normalizer, actor, the map onto the env's action bounds: `nets.policy.BoundedPolicy`, the module
`aa-ray export` writes):

- PyTorch: `mlflow.pytorch.save_model` with `serialization_format="pt2"`, a `torch.export` program.
  Chosen over TorchScript (the export command's format) because MLflow 3 refuses to load a model it
  would have to unpickle unless `MLFLOW_ALLOW_PICKLE_DESERIALIZATION` is set, and a TorchScript
  archive counts as one; an exported program loads as it is, and like TorchScript needs no aa-ray
  code. It takes the actor's features side by side (N, obs_dim), as the exported files do.
- pyfunc: a loader module (`policy_pyfunc.py`, copied into the model, importing no aa-ray) around
  that program, so loading and serving need torch and MLflow only. Its signature is tensors from
  observations to actions; for a Dict-observation env it names the actor's keys (one (N, dim)
  tensor each), which MLflow's own PyTorch pyfunc cannot take (it reads one array).

Saving happens on the driver, into the run folder (`models/<name>`), so the model is on disk
whatever the store does; `ModelUpload` then stores it through the run's outbox as any artifact,
each step once, so a store that goes down mid-upload is retried from where it stopped.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import mlflow.pytorch
import numpy as np
import pandas as pd
import torch
from mlflow.entities import LoggedModelOutput, LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.models.model import MLMODEL_FILE_NAME
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.types import Schema, TensorSpec
from packaging.version import Version

from aa_ray.algos.registry import build_policy
from aa_ray.envs import env_dims
from aa_ray.envs.make import first_observations
from aa_ray.nets.policy import BoundedPolicy
from aa_ray.records import ObsDims
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.tracking import policy_pyfunc

FINAL_MODEL, BEST_MODEL = "policy", "best_policy"  # the logged models' names in a run
PYTORCH_FOLDER = "pytorch"  # the PyTorch flavor's own MLflow model, inside the logged model's data/
_EXAMPLE_ROWS = 2  # torch.export fixes a batch dimension of 1: the example has two observations
_FLOAT = np.dtype(np.float32)


@dataclass(frozen=True)
class SavedModel:
    """An MLflow model folder on disk and what the run logs it as."""

    name: str
    folder: Path
    env_steps: int  # the training step of its weights (the model's step in the run's outputs)
    seconds: float  # how long saving took


def acting_policy(
    spec: ExperimentSpec, policy_state: dict[str, torch.Tensor]
) -> tuple[BoundedPolicy, ObsDims, np.ndarray]:
    """The deterministic acting module of these weights (evaluation mode), the env's observation
    layout, and two first observations of the env (the actor's features), for the model's example."""
    obs, act_dim = env_dims(spec)
    network = build_policy(spec.algo, obs, act_dim)
    network.load_state_dict(policy_state)
    network.eval().requires_grad_(False)
    first_obs, low, high = first_observations(spec, _EXAMPLE_ROWS)
    example = np.ascontiguousarray(first_obs[:, : obs.actor])
    return BoundedPolicy(network, low, high).eval(), obs, example


def actor_groups(obs: ObsDims) -> list[tuple[str, int]]:
    """The actor's Dict keys and their feature counts, in the order its features are concatenated
    (empty for a flat observation)."""
    keys = obs.actor_keys
    return [(key, dim) for key, dim in obs.groups if key in keys]


def policy_signature(obs: ObsDims, act_dim: int) -> ModelSignature:
    """Observations to actions: one (N, obs_dim) float32 tensor, or one per actor key, named."""
    groups = actor_groups(obs)
    inputs = ([TensorSpec(_FLOAT, (-1, dim), key) for key, dim in groups] if groups
              else [TensorSpec(_FLOAT, (-1, obs.actor))])
    return ModelSignature(inputs=Schema(inputs), outputs=Schema([TensorSpec(_FLOAT, (-1, act_dim), "action")]))


def split_by_key(features: np.ndarray, obs: ObsDims) -> dict[str, np.ndarray] | np.ndarray:
    """The actor's features as the pyfunc takes them: per key for a Dict observation."""
    groups = actor_groups(obs)
    if not groups:
        return features
    bounds = np.cumsum([0] + [dim for _, dim in groups])
    return {key: features[:, bounds[i] : bounds[i + 1]] for i, (key, _) in enumerate(groups)}


def pip_requirements() -> list[str]:
    """What loading the model needs, pinned to this process's versions (given, so MLflow does not
    spend seconds inferring them in a subprocess)."""
    return [f"mlflow=={mlflow.__version__}", f"torch=={Version(torch.__version__).public}",
            f"numpy=={np.__version__}", f"pandas=={pd.__version__}"]


def save_policy_model(spec: ExperimentSpec, policy_state: dict[str, torch.Tensor], folder: Path, name: str,
                      env_steps: int) -> SavedModel:
    """Write the policy of these weights as an MLflow model folder (PyTorch and pyfunc flavors,
    signature, input example). `folder` must not exist yet."""
    started = time.perf_counter()
    bounded, obs, example = acting_policy(spec, policy_state)
    act_dim = int(bounded.low.shape[0])
    requirements = pip_requirements()
    with tempfile.TemporaryDirectory() as scratch:
        pytorch_model = Path(scratch) / PYTORCH_FOLDER
        features = ModelSignature(inputs=Schema([TensorSpec(_FLOAT, (-1, obs.actor), "obs")]),
                                  outputs=policy_signature(obs, act_dim).outputs)
        mlflow.pytorch.save_model(bounded, str(pytorch_model), serialization_format="pt2", signature=features,
                                  input_example=example, pip_requirements=requirements)
        model = Model()
        mlflow.pyfunc.save_model(
            str(folder), loader_module=policy_pyfunc.__name__.rpartition(".")[2], data_path=str(pytorch_model),
            code_paths=[policy_pyfunc.__file__], mlflow_model=model, signature=policy_signature(obs, act_dim),
            input_example=split_by_key(example, obs), pip_requirements=requirements,
            model_config={"obs_keys": [key for key, _ in actor_groups(obs)]},
            metadata={"env": spec.env.id, "algo": spec.algo.name, "env_steps": env_steps},
        )
    # the PyTorch flavor MLflow wrote for the program, re-rooted here, so that
    # mlflow.pytorch.load_model(<this model's URI>) loads it too
    pytorch_flavor = Model.load(str(folder / "data" / PYTORCH_FOLDER)).flavors[mlflow.pytorch.FLAVOR_NAME]
    model.add_flavor(mlflow.pytorch.FLAVOR_NAME,
                     **{**pytorch_flavor, "model_data": f"data/{PYTORCH_FOLDER}/{pytorch_flavor['model_data']}"})
    model.save(str(folder / MLMODEL_FILE_NAME))
    return SavedModel(name, folder, env_steps, time.perf_counter() - started)


class ModelUpload:
    """Stores a saved model in a run as its logged model `saved.name` (MLflow's LoggedModel: the
    run's "Logged models", `runs:/<run id>/<name>`, `models:/<model id>`), then, if asked,
    registers it. Each step is done once: the outbox retries a call that met an outage from the
    start, and this resumes it where it stopped."""

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, saved: SavedModel):
        self.client, self.run_id, self.experiment_id, self.saved = client, run_id, experiment_id, saved
        self.model_id: str | None = None
        self.steps_done: set[str] = set()
        self.registered: tuple[str, str] | None = None  # (name, version) once registered

    @property
    def stored(self) -> bool:
        return "finalized" in self.steps_done

    def _once(self, step: str, call: Any) -> None:
        if step not in self.steps_done:
            call()
            self.steps_done.add(step)

    def send(self) -> None:
        client, saved = self.client, self.saved
        if self.model_id is None:
            self.model_id = client.create_logged_model(
                self.experiment_id, name=saved.name, source_run_id=self.run_id, model_type="policy",
                tags={"env_steps": str(saved.env_steps)},
            ).model_id
        model_id = self.model_id
        self._once("artifacts", lambda: client.log_model_artifacts(model_id, str(saved.folder)))
        self._once("output", lambda: client.log_outputs(self.run_id, [LoggedModelOutput(model_id, saved.env_steps)]))
        self._once("finalized", lambda: client.finalize_logged_model(model_id, LoggedModelStatus.READY))

    def register(self, registered_name: str) -> None:
        """A new version of `registered_name` (made if missing) from the stored model."""
        if not self.stored:
            raise RuntimeError(f"the model {self.saved.name} was not stored, so it cannot be registered")
        try:
            self.client.create_registered_model(registered_name)
        except MlflowException as err:
            if err.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
        if self.registered is None:
            version = self.client.create_model_version(
                registered_name, source=f"models:/{self.model_id}", run_id=self.run_id, model_id=self.model_id,
                await_creation_for=0,
            )
            self.registered = (registered_name, str(version.version))
