"""The driver's plain parts, without Ray: the cadence (when a run evaluates, checkpoints, reports
and stops) and the learner health checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from aa_ray import metric_names as m
from aa_ray.errors import SpecError
from aa_ray.runtime.cadence import BUDGET, TARGET_REACHED, Cadence
from aa_ray.runtime.health import HealthChecks
from aa_ray.runtime.remote import TrainingError
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import apply_overrides, load_spec, read_yaml, validate_spec
from aa_ray.spec.local_checks import check_stop_metric

SPECS = Path(__file__).resolve().parents[1] / "specs"


def spec(*overrides: str):
    return load_spec(SPECS / "sac.yaml", ["budget.env_steps=1000", "algo.warm_up_steps=100", *overrides])


def walk(cadence: Cadence, steps: range, evaluation: dict[str, float] | None = None) -> list[tuple]:
    """(env steps, evaluated, checkpointed, reported, stop reason) for each iteration end, until a stop."""
    ends = []
    for env_steps in steps:
        due = cadence.due(env_steps)
        result = dict(evaluation or {m.EVAL_RETURN: 0.0}) if due.evaluate else None
        outcome = cadence.outcome(env_steps, due, result)
        ends.append((env_steps, due.evaluate, outcome.checkpoint, outcome.report, outcome.stop_reason))
        if outcome.stop_reason:
            break
    return ends


def test_a_run_evaluates_and_checkpoints_on_schedule_and_stops_at_its_budget() -> None:
    cadence = Cadence(spec("eval.every_env_steps=300", "checkpoint.every_env_steps=400"), reports=False)
    ends = walk(cadence, range(100, 1300, 100))
    assert [s for s, evaluated, *_ in ends if evaluated] == [300, 600, 900, 1000]  # and at the end
    assert [s for s, _, checkpointed, *_ in ends if checkpointed] == [400, 800]  # the final one is the trainer's
    assert not any(reported for *_, reported, _ in ends)
    assert ends[-1] == (1000, True, False, False, BUDGET)


def test_a_tune_trial_evaluates_when_it_checkpoints_and_reports_each_but_the_last() -> None:
    cadence = Cadence(spec("eval.every_env_steps=500", "checkpoint.every_env_steps=200"), reports=True)
    ends = walk(cadence, range(100, 1100, 100))
    assert [s for s, evaluated, *_ in ends if evaluated] == [200, 400, 500, 600, 800, 1000]
    # the final report, with the final checkpoint, is the trainer's
    assert [s for s, _, _, reported, _ in ends if reported] == [200, 400, 500, 600, 800]


def test_reaching_the_target_stops_the_run_without_the_checkpoint_due_then() -> None:
    cadence = Cadence(spec("eval.every_env_steps=200", "checkpoint.every_env_steps=200",
                           "budget.stop_at_eval_return=-5"), reports=True)
    assert walk(cadence, range(100, 1100, 100), {m.EVAL_RETURN: -1.0})[-1] == (200, True, False, False, TARGET_REACHED)
    cadence = Cadence(spec("eval.every_env_steps=400", "checkpoint.every_env_steps=400",
                           "budget.stop_at_eval_distance=0.05", "budget.stop_at_eval_return=100"), reports=False)
    ends = walk(cadence, range(100, 1100, 100), {m.EVAL_RETURN: 0.0, "eval/distance": 0.01})
    assert ends[-1] == (400, True, False, False, TARGET_REACHED)  # the distance decides where the env has one
    ends = walk(cadence, range(100, 1100, 100), {m.EVAL_RETURN: 200.0, "eval/distance": 0.06})
    assert ends[-1][-1] == BUDGET  # even where the return is past its bound
    ends = walk(Cadence(spec("budget.stop_at_eval_distance=0.05"), reports=False), range(100, 1100, 100))
    assert ends[-1][-1] == BUDGET  # an env without eval/distance skips the shorthand, as it always did


@pytest.mark.parametrize(("stop_at", "reached", "missed"), [
    ("{metric: eval/distance, below: 0.009}", 0.0089, 0.009),  # strictly below
    ("{metric: eval/return, above: 300}", 300.0, 299.9),  # at or above
    ("{metric: eval/success, above: 0.9}", 0.95, 0.8),
])
def test_stop_at_names_any_eval_metric_and_a_bound(stop_at: str, reached: float, missed: float) -> None:
    rule = spec(f"budget.stop_at={stop_at}").budget.stop_at
    for value, reason in ((missed, BUDGET), (reached, TARGET_REACHED)):
        cadence = Cadence(spec(f"budget.stop_at={stop_at}", "eval.every_env_steps=500"), reports=False)
        ends = walk(cadence, range(100, 1100, 100), {m.EVAL_RETURN: 0.0, rule.metric: value})
        assert ends[-1][0] == (1000 if reason == BUDGET else 500) and ends[-1][-1] == reason
    # an evaluation without the metric (no is_success, say) never stops the run
    cadence = Cadence(spec(f"budget.stop_at={stop_at}"), reports=False)
    assert walk(cadence, range(100, 1100, 100), {"eval/length": 0.0})[-1][-1] == BUDGET


def test_a_stop_metric_the_evaluations_never_produce_is_refused_before_the_run_starts() -> None:
    """pusher-reach declares distance; `error` is no metric of it unless the spec lists it."""
    for fine in ("eval/return", "eval/success", "eval/distance"):
        check_stop_metric(spec(f"budget.stop_at={{metric: {fine}, below: 1}}"))
    check_stop_metric(spec("budget.stop_at={metric: eval/error, below: 1}", "eval.info_metrics=[error]"))
    overrides = ["budget.stop_at={metric: eval/error, below: 1}", "tracking.enabled=false", "runtime.backend=inline"]
    with pytest.raises(SpecError, match="budget.stop_at.metric: the evaluations"):  # load_spec refuses it first
        spec(*overrides)
    # a spec that skipped load_spec's checks (the Python API's dict, say) is refused by the run itself
    raw = apply_overrides(read_yaml(SPECS / "sac.yaml"), ["budget.env_steps=1000", "algo.warm_up_steps=100"])
    raw = apply_overrides(raw, overrides)
    refused = validate_spec(raw)
    with pytest.raises(SpecError) as err:
        Trainer(refused, live=False).run()
    assert str(err.value).startswith("budget.stop_at.metric: the evaluations of aa_ray/PusherReach-v0 never "
                                     "produce eval/error")
    assert "eval/return, eval/length, eval/success, eval/distance" in str(err.value)
    assert not Path("runs").exists()  # refused before anything was written


def test_a_resumed_run_keeps_its_evaluation_schedule_and_checkpoints_from_where_it_resumed() -> None:
    cadence = Cadence(spec("eval.every_env_steps=300", "checkpoint.every_env_steps=400"), reports=False,
                      env_steps=650, next_eval=900)
    ends = walk(cadence, range(700, 1100, 50))
    assert [s for s, evaluated, *_ in ends if evaluated] == [900, 1000]
    assert [s for s, _, checkpointed, *_ in ends if checkpointed] == []  # 650 + 400 is past the budget
    cadence = Cadence(spec("checkpoint.every_env_steps=100"), reports=False, env_steps=650, next_eval=2000)
    assert [s for s, _, checkpointed, *_ in walk(cadence, range(700, 1100, 50)) if checkpointed] == [750, 850, 950]


def test_updates_that_keep_failing_stop_the_run_naming_where_to_resume() -> None:
    checks = HealthChecks(spec("runtime.max_consecutive_skips=5"))
    checks.check({m.LEARNER_CONSECUTIVE_SKIPS: 4.0}, "resume with X")
    with pytest.raises(TrainingError, match=r"last 5 gradient steps.*max_consecutive_skips=5.*resume with X"):
        checks.check({m.LEARNER_CONSECUTIVE_SKIPS: 5.0}, "resume with X")


def test_exploding_values_are_flagged_every_time_and_reported_as_an_event_once() -> None:
    checks = HealthChecks(spec("runtime.q_warning_bound=1000"))
    calm = {m.LEARNER_LARGEST_VALUE: 999.0}
    assert checks.check(calm, "") is None and calm[m.LEARNER_Q_EXPLODING] == 0.0
    exploding = {m.LEARNER_LARGEST_VALUE: 5000.0}
    assert checks.check(exploding, "") == {"value": 5000.0, "bound": 1000.0}
    assert exploding[m.LEARNER_Q_EXPLODING] == 1.0
    again = {m.LEARNER_LARGEST_VALUE: 6000.0}
    assert checks.check(again, "") is None and again[m.LEARNER_Q_EXPLODING] == 1.0
