"""The pyfunc loader of an aa-ray policy logged as an MLflow Model (`aa_ray.tracking.models`).

MLflow copies this file into the model (its `code/` folder) and imports it from there when the
model is loaded (`mlflow.pyfunc.load_model`, `mlflow models serve`), so a logged policy loads
where aa-ray is not installed: this module imports MLflow, torch and numpy, never aa-ray. The
policy itself is the model's PyTorch flavor, a `torch.export` program of the observation normalizer,
the actor and the map onto the env's action bounds, which MLflow's own `mlflow.pytorch.load_model`
loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mlflow.pytorch
import numpy as np
import pandas as pd
import torch


class ExportedPolicy:
    """Deterministic env actions for raw observations: a batch of the actor's features (N, obs_dim),
    or, for a Dict-observation env, a mapping of the actor's keys to their (N, dim) batches."""

    def __init__(self, module: torch.nn.Module, obs_keys: Sequence[str]):
        self.module = module
        self.obs_keys = tuple(obs_keys)  # empty for a flat observation

    def predict(self, data: Any, params: Mapping[str, Any] | None = None) -> np.ndarray:
        with torch.no_grad():
            return self.module(torch.from_numpy(self._features(data))).numpy()

    def _features(self, data: Any) -> np.ndarray:
        """The module's input: the actor's features side by side, float32, one row per observation."""
        if self.obs_keys and isinstance(data, Mapping | pd.DataFrame):
            missing = [key for key in self.obs_keys if key not in data]
            if missing:
                raise ValueError(f"the policy reads observation keys {list(self.obs_keys)}; missing {missing}")
            parts = [_rows(data[key]) for key in self.obs_keys]
            return np.ascontiguousarray(np.concatenate(parts, axis=-1), dtype=np.float32)
        return _rows(data)


def _rows(values: Any) -> np.ndarray:
    """A batch of feature rows from an array, a list of rows or a DataFrame column of arrays."""
    if isinstance(values, pd.Series):  # a column of per-row arrays (MLflow's DataFrame input)
        values = np.stack([np.asarray(row, dtype=np.float32) for row in values])
    elif isinstance(values, pd.DataFrame):
        values = values.to_numpy(dtype=np.float32)
    rows = np.asarray(values, dtype=np.float32)
    return np.ascontiguousarray(rows[None] if rows.ndim == 1 else rows)


def _load_pyfunc(data_path: str, model_config: Mapping[str, Any] | None = None) -> ExportedPolicy:
    """MLflow's loader hook: `data_path` is the PyTorch model folder inside the logged model."""
    config = dict(model_config or {})
    module = mlflow.pytorch.load_model(data_path, device=config.get("device") or "cpu")
    return ExportedPolicy(module, config.get("obs_keys") or ())
