"""The cadence: after each iteration, whether the run evaluates, checkpoints, reports to Tune and
stops, and why it stopped. Plain logic on env-step counts, no Ray.

    due = cadence.due(env_steps)                  # before evaluating
    evaluation = evaluate() if due.evaluate else None
    outcome = cadence.outcome(env_steps, due, evaluation)

The run stops at its budget, or once an evaluation crosses `budget.stop_at` (`{metric: eval/..., below:
x}` or `above: x`; the older shorthands `budget.stop_at_eval_*` are such rules, see
`BudgetSpec.stop_rules`). `spec.local_checks.check_stop_metric` refuses, before the run starts, a
`budget.stop_at` metric that its evaluations never produce. It evaluates every `eval.every_env_steps` and at the
end; a Tune trial also evaluates when it checkpoints, so its first report already has eval metrics.
A checkpoint is written every `checkpoint.every_env_steps`, except at the end (the trainer writes
the final one). A Tune trial reports every evaluation and checkpoint, except the last (its final
report comes with the final checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

from aa_ray.spec.experiment import ExperimentSpec

BUDGET = "budget"
TARGET_REACHED = "target reached"
STOPPED_BY_CALLBACK = "stopped by a callback"  # a reporter (the Python API's callbacks) said stop
PREEMPTED = "preempted"  # a stop signal (SIGTERM, SIGINT): checkpointed, to be resumed


@dataclass(frozen=True)
class Due:
    evaluate: bool
    checkpoint: bool  # unless the evaluation ends the run
    budget_spent: bool


@dataclass(frozen=True)
class Outcome:
    stop_reason: str | None  # None: the run goes on
    checkpoint: bool
    report: bool


class Cadence:
    def __init__(self, spec: ExperimentSpec, reports: bool, env_steps: int = 0, next_eval: int | None = None):
        """`reports`: a Tune trial's run. A resumed run starts at `env_steps` with its `next_eval`."""
        self.budget = spec.budget
        self.eval_every = spec.eval.every_env_steps
        self.checkpoint_every = spec.checkpoint.every_env_steps or spec.budget.env_steps + 1
        self.reports = reports
        self.next_eval = self.eval_every if next_eval is None else next_eval
        self.next_checkpoint = env_steps + self.checkpoint_every

    def due(self, env_steps: int) -> Due:
        budget_spent = env_steps >= self.budget.env_steps
        checkpoint = env_steps >= self.next_checkpoint and not budget_spent
        evaluate = env_steps >= self.next_eval or budget_spent or (checkpoint and self.reports)
        return Due(evaluate=evaluate, checkpoint=checkpoint, budget_spent=budget_spent)

    def outcome(self, env_steps: int, due: Due, evaluation: dict[str, float] | None) -> Outcome:
        """What the end of this iteration does, given its evaluation (None if it had none); moves
        the next evaluation and checkpoint on."""
        stop_reason = BUDGET if due.budget_spent else None
        if evaluation is not None:
            self.next_eval = (env_steps // self.eval_every + 1) * self.eval_every
            if self.target_reached(evaluation):
                stop_reason = TARGET_REACHED
        checkpoint = due.checkpoint and stop_reason is None
        if checkpoint:
            self.next_checkpoint += self.checkpoint_every
        report = self.reports and stop_reason is None and (evaluation is not None or checkpoint)
        return Outcome(stop_reason=stop_reason, checkpoint=checkpoint, report=report)

    def target_reached(self, evaluation: dict[str, float]) -> bool:
        """The first stop rule whose metric the evaluation has decides (eval/success is there only
        where the env reports is_success)."""
        for rule in self.budget.stop_rules:
            if rule.metric in evaluation:
                return rule.reached(evaluation)
        return False
