"""The driver's checks on the learners' health, from the metrics of each update: gradient steps
that keep coming out non-finite stop the run (pointing at the checkpoint to resume from); values
beyond `runtime.q_warning_bound` are flagged in every log (`learner/q_exploding`) and written as
an event once."""

from __future__ import annotations

from typing import Any

from aa_ray import metric_names as m
from aa_ray.runtime.remote import TrainingError
from aa_ray.spec.experiment import ExperimentSpec


class HealthChecks:
    def __init__(self, spec: ExperimentSpec):
        self.max_consecutive_skips = spec.runtime.max_consecutive_skips
        self.q_warning_bound = spec.runtime.q_warning_bound
        self.q_warned = False

    def check(self, metrics: dict[str, float], resume_hint: str) -> dict[str, Any] | None:
        """Adds `learner/q_exploding` to `metrics`. TrainingError after too many skipped steps in a
        row; the details of a `q_exploding` event the first time the values explode, else None."""
        skips = metrics.get(m.LEARNER_CONSECUTIVE_SKIPS, 0)
        if skips >= self.max_consecutive_skips:
            raise TrainingError(
                f"the last {int(skips)} gradient steps had non-finite losses or gradients "
                f"(runtime.max_consecutive_skips={self.max_consecutive_skips}), so the run stopped; check the "
                f"env's rewards and observations and the learning rates; {resume_hint}"
            )
        largest = metrics.get(m.LEARNER_LARGEST_VALUE, 0.0)
        exploding = largest > self.q_warning_bound
        metrics[m.LEARNER_Q_EXPLODING] = float(exploding)
        if exploding and not self.q_warned:
            self.q_warned = True
            return {"value": largest, "bound": self.q_warning_bound}
        return None
