"""Our own Ray metrics (`ray.util.metrics`), exported in Prometheus format by every node's metrics
agent beside Ray's, for the Grafana dashboard in `dashboards/`.

Prometheus names are `ray_` + the name below (+ `_total` for counters). Tags stay few and small
so the series count does not grow with a run's length: `run` (spec name and hash), `runner`,
`rank` or `shard` (small integers), `loss` (one of the algorithm's loss names).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the replay actor counts with RunMetrics alone, without the spec's imports (torch among them)
    from aa_ray.spec.experiment import ExperimentSpec

# name -> (kind, description, tag keys)
DEFINITIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "aa_ray_env_steps": ("counter", "env steps (transitions) collected by a runner", ("run", "runner")),
    "aa_ray_env_steps_per_s": ("gauge", "a runner's env steps per second over its last chunk", ("run", "runner")),
    "aa_ray_replay_size": ("gauge", "transitions stored in a replay shard (the buffer, unsharded)", ("run", "shard")),
    "aa_ray_replay_sampled": ("counter", "transitions sampled from a replay shard", ("run", "shard")),
    "aa_ray_learner_updates": ("counter", "gradient updates made by a learner", ("run", "rank")),
    "aa_ray_learner_updates_per_s": ("gauge", "a learner's gradient updates per second in its last call",
                                     ("run", "rank")),
    "aa_ray_loss": ("gauge", "the last value of each loss a learner reports", ("run", "rank", "loss")),
    "aa_ray_policy_lag": ("gauge", "async mode: weight versions a runner's policy is behind", ("run",)),
    "aa_ray_episode_return": ("gauge", "mean return of recently finished training episodes", ("run",)),
    "aa_ray_eval_return": ("gauge", "mean return of the last evaluation", ("run",)),
}


def run_tag(spec: ExperimentSpec) -> str:
    """The `run` tag: what a run folder and MLflow run are named by, without the time."""
    from aa_ray.spec.loader import spec_hash

    return f"{spec.name}-{spec_hash(spec)[:8]}"


def prometheus_name(name: str) -> str:
    return f"ray_{name}" + ("_total" if DEFINITIONS[name][0] == "counter" else "")


class RunMetrics:
    """The metrics one process records for one run. Create it in the process that records (an
    actor's `__init__`); each call is a cheap in-process update that Ray exports periodically.

    Outside a Ray process (a plain class used in a notebook, or on a machine without Ray) there is
    no metrics agent to export to, and every call does nothing."""

    def __init__(self, run: str, **tags: Any):
        self.tags = {"run": run, **{key: str(value) for key, value in tags.items()}}
        self._metrics: dict[str, Any] = {}
        self._ray_metrics = _ray_metrics_module()

    def _get(self, name: str) -> Any:
        if name not in self._metrics:
            kind, description, tag_keys = DEFINITIONS[name]
            make = self._ray_metrics.Counter if kind == "counter" else self._ray_metrics.Gauge
            self._metrics[name] = make(name, description=description, tag_keys=tag_keys)
        return self._metrics[name]

    def set(self, name: str, value: float, **tags: str) -> None:
        if self._ray_metrics is not None:
            self._get(name).set(float(value), tags={**self.tags, **tags})

    def inc(self, name: str, value: float) -> None:
        if self._ray_metrics is not None and value > 0:
            self._get(name).inc(float(value), tags=self.tags)

    def losses(self, info: dict[str, float]) -> None:
        """Every `.../..._loss` or `.../loss` value of an update's diagnostics, tagged by its name."""
        for key, value in info.items():
            if key.endswith("loss"):
                self.set("aa_ray_loss", value, loss=key)


def _ray_metrics_module() -> Any:
    """`ray.util.metrics` inside a process connected to Ray, None anywhere else."""
    ray = sys.modules.get("ray")  # imported by whoever started this process as a Ray worker or driver
    if ray is None or not ray.is_initialized():
        return None
    from ray.util import metrics

    return metrics
