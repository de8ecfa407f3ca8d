"""Which format a dataset is in, and opening it as one interface: Parquet (`dataset.py`, the default)
or Minari (`minari_format.py`). Above both formats, so that neither imports the other; the prior data
of an RLPD run is checked here before any actor starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aa_ray.data.minari_format as minari_format
from aa_ray.data.dataset import DatasetError, DatasetMeta, TransitionDataset, dataset_meta, read_parquet
from aa_ray.records import ObsDims


def read_dataset(
    path: str | Path,
    expect_env_id: str | None = None,
    expect_obs_dim: int | None = None,
    expect_act_dim: int | None = None,
) -> TransitionDataset | minari_format.MinariTransitions:
    """Open and validate a dataset of either format (see `dataset.read_parquet`): a Minari dataset
    folder is opened with `minari`, anything else as Parquet."""
    if minari_format.is_minari_folder(Path(path)):
        return minari_format.read_minari(Path(path), expect_env_id, expect_obs_dim, expect_act_dim)
    return read_parquet(path, expect_env_id, expect_obs_dim, expect_act_dim)


def checked_prior_data(spec: Any, obs: ObsDims | int, act_dim: int) -> Path | None:
    """`algo.prior_data`'s dataset, checked against the env and its values read once (no NaN,
    infinity or action outside the action space): a Parquet file or folder (relative to the cwd), or a
    Minari dataset (its folder, or its id under MINARI_DATASETS_PATH), whose spaces must be the env's.
    Returns the dataset's resolved path (a Minari id resolved to its folder, so every process reads
    the same one)."""
    if spec.prior_data is None:
        return None
    obs = ObsDims.of(obs)
    minari_path = minari_format.resolve(spec.prior_data)
    path = minari_path or Path(spec.prior_data).expanduser().resolve()
    if not path.exists():
        raise DatasetError(
            f"algo.prior_data: dataset {spec.prior_data!r} not found: no Parquet file or folder at {path}"
            f"{minari_format.missing_hint(str(spec.prior_data))}; make it with `aa-ray rollout`."
        )
    try:
        dataset = read_dataset(path, expect_env_id=spec.env.id, expect_obs_dim=obs.full, expect_act_dim=act_dim)
        if isinstance(dataset, minari_format.MinariTransitions):
            if obs.groups:
                raise DatasetError(f"{dataset.describe()}: this run reads grouped observations "
                                   f"({', '.join(key for key, _ in obs.groups)}); Minari prior data must be flat.")
            env = _env_meta(spec)
            dataset.check_spaces(spec.env.id, env.observation_space, env.action_space)
        dataset.check_values()
    except DatasetError as err:
        raise DatasetError(f"algo.prior_data: {err}") from None
    if dataset.meta.obs_groups != obs.groups:
        raise DatasetError(
            f"algo.prior_data: dataset {path} holds observation keys {list(dataset.meta.obs_groups) or 'none'}, "
            f"but this run reads {list(obs.groups) or 'a flat observation'} (algo.actor_obs / algo.critic_obs)."
        )
    return path


def _env_meta(spec: Any) -> DatasetMeta:
    """What a dataset recorded on the spec's env would say about its spaces."""
    return dataset_meta(spec, producer="")
