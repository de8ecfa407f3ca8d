"""Task metrics from the env's step info: which keys a run records at each episode's last step, and
how it reads them out of a gymnasium vector env's info.

An env declares its task metrics in its metadata (`metadata["info_metrics"] = ["distance"]`, as
pusher-reach does); a spec adds more in `eval.info_metrics`. Each numeric key becomes `eval/<key>`
(the mean over the eval episodes), `train/<key>` (the mean over the recent training episodes) and a
rollout's `mean_<key>`. `info["is_success"]` (the gymnasium-robotics / SB3 convention), where the
env reports it, always becomes `eval/success` and `train/success`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aa_ray.metric_names import INFO_KEY

if TYPE_CHECKING:
    import gymnasium as gym

    from aa_ray.spec.experiment import ExperimentSpec

METADATA_KEY = "info_metrics"  # the env's declared task metrics, a list of info keys
SUCCESS_KEY = "is_success"
SUCCESS = "success"  # is_success's metric name: eval/success, train/success


def metric_name(key: str) -> str:
    """The metric an info key becomes, after `eval/` or `train/` (is_success -> success)."""
    return SUCCESS if key == SUCCESS_KEY else key


def declared_info_metrics(env: gym.Env | gym.vector.VectorEnv) -> list[str]:
    """The env's own task metrics: `metadata["info_metrics"]` (a vector env's metadata is its first
    copy's). ValueError naming the env's class when they are not a list of simple identifiers."""
    declared = (getattr(env, "metadata", None) or {}).get(METADATA_KEY, [])
    if isinstance(declared, str) or not all(isinstance(k, str) and INFO_KEY.fullmatch(k) for k in declared):
        owner = type(getattr(env, "unwrapped", env)).__name__
        raise ValueError(
            f"{owner}.metadata[{METADATA_KEY!r}] must be a list of info keys, each a simple identifier "
            f"([A-Za-z_][A-Za-z0-9_]*), got {declared!r}"
        )
    return list(declared)


def tracked_info_keys(spec: ExperimentSpec, env: gym.Env | gym.vector.VectorEnv) -> tuple[str, ...]:
    """The info keys a runner reads at each episode's end: is_success, the env's declared metrics,
    then the spec's eval.info_metrics (each once)."""
    return tuple(dict.fromkeys([SUCCESS_KEY, *declared_info_metrics(env), *spec.eval.info_metrics]))


def final_info(info: dict[str, Any], i: int, keys: tuple[str, ...]) -> dict[str, float]:
    """The values of `keys` that env copy `i` reported in a vector env's `info` (a key's `_key` mask
    says which copies did), as floats. ValueError naming the key when one is not a number."""
    values = {}
    for key in keys:
        if key not in info:
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        try:
            values[key] = float(info[key][i])
        except (TypeError, ValueError):
            raise ValueError(
                f"info[{key!r}] is not a number (got {info[key][i]!r}); list only numeric info keys in "
                f"eval.info_metrics and the env's metadata[{METADATA_KEY!r}]"
            ) from None
    return values
