"""Progress display: a live rich panel on a terminal, plain periodic log lines otherwise.

Everything shown here may hold a user's string (the run's name, an env id, a metric key, a path,
an error message), so nothing is ever read as rich markup (a name with "[" would otherwise be a
markup error after training began, or restyle the panel) and control characters are shown as
escapes, not obeyed (ANSI sequences, carriage returns): `shown` makes every piece of text.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.control import CONTROL_ESCAPE
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from aa_ray import metric_names as m

if TYPE_CHECKING:
    from aa_ray.spec.experiment import ExperimentSpec

_SHOWN_LOSSES = (m.CRITIC_Q_LOSS, m.CRITIC_Q_VALUE, m.ACTOR_LOSS, m.ACTOR_ALPHA, m.ACTOR_ENTROPY)

# every C0 and C1 control character but newline and tab, as \xNN (rich's own \a \b \v \f \r for
# those it names): rich passes ESC through, so a string could otherwise move the cursor or clear the screen
_VISIBLE_CONTROLS = {
    code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if chr(code) not in "\n\t"
} | CONTROL_ESCAPE


def printable(text: str) -> str:
    """`text` with its control characters shown as escapes, for any terminal."""
    return text.translate(_VISIBLE_CONTROLS)


def shown(text: str, style: str = "") -> Text:
    """A string for the console: never read as markup or emoji codes, control characters visible."""
    return Text(printable(text), style=style)


def task_metric(spec: ExperimentSpec) -> str | None:
    """The eval metric the progress display shows beside the return: the spec's stop metric (the
    first stop rule's, unless that is the return itself); None: eval/success where the env has it."""
    metrics = [rule.metric for rule in spec.budget.stop_rules if rule.metric != m.EVAL_RETURN]
    return metrics[0] if metrics else None


class ProgressDisplay:
    def __init__(
        self, title: str, total_env_steps: int, live: bool | None = None, log_every_s: float = 10.0,
        task_metric: str | None = None, console: Console | None = None,
    ):
        self.title = title
        self.task_metric = task_metric  # None: eval/success, once an evaluation has it
        self.total = total_env_steps
        self.console = console or Console(stderr=True)
        self.live_mode = sys.stderr.isatty() if live is None else live
        self.log_every_s = log_every_s
        self.last_log = 0.0
        self.status: dict[str, Any] = {}
        self.bar = Progress(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,} env steps"),
            TimeElapsedColumn(), TimeRemainingColumn(),
        )
        self.task = self.bar.add_task(printable(title), total=total_env_steps)
        self.live: Live | None = None

    def __enter__(self) -> ProgressDisplay:
        if self.live_mode:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)

    def update(self, env_steps: int, metrics: dict[str, float]) -> None:
        self.status.update(metrics)
        self.bar.update(self.task, completed=min(env_steps, self.total))
        if self.live is not None:
            self.live.update(self._render())
        elif time.monotonic() - self.last_log >= self.log_every_s:
            self.last_log = time.monotonic()
            self.console.print(shown(self._line(env_steps)), highlight=False)

    def message(self, text: str) -> None:
        self.console.print(shown(text), highlight=False)

    def _shown_task_metric(self) -> str:
        return self.task_metric or m.EVAL_SUCCESS

    def _line(self, env_steps: int) -> str:
        parts = [f"[{self.title}] env_steps {env_steps:,}/{self.total:,}"]
        line = (m.ENV_STEPS_PER_S, m.LEARNER_UPDATES_PER_S, m.REPLAY_SIZE, m.TRAIN_EPISODE_RETURN, m.EVAL_RETURN,
                self._shown_task_metric(), *_SHOWN_LOSSES)
        for key in line:
            if key in self.status:
                parts.append(f"{key} {self.status[key]:.4g}")
        return "  ".join(parts)

    def _render(self) -> Table:
        s = self.status
        grid = Table.grid(padding=(0, 2))
        grid.add_row(self.bar)
        stats = Table(show_header=True, header_style="bold", box=None)
        for column in ("throughput", "replay", "last eval", "losses", "time per iteration"):
            stats.add_column(column)
        fmt = lambda k, spec=".4g": f"{s[k]:{spec}}" if k in s else "-"  # noqa: E731
        task = self._shown_task_metric()
        cells = (
            f"env steps/s {fmt(m.ENV_STEPS_PER_S, '.0f')}\nupdates/s {fmt(m.LEARNER_UPDATES_PER_S, '.0f')}",
            f"size {fmt(m.REPLAY_SIZE, ',.0f')}\nfill {fmt(m.REPLAY_FILL, '.0%')}",
            f"return {fmt(m.EVAL_RETURN)}\n{task.removeprefix(m.EVAL_PREFIX)} {fmt(task)}\n"
            f"at step {fmt(m.EVAL_AT_ENV_STEPS, ',.0f')}",
            "\n".join(f"{k} {fmt(k)}" for k in _SHOWN_LOSSES),
            "\n".join(f"{phase} {s[f'time/{phase}_s'] * 1e3:.1f} ms" for phase in m.PHASES if f"time/{phase}_s" in s),
        )
        stats.add_row(*(shown(cell) for cell in cells))
        grid.add_row(stats)
        return grid
