"""Helpers shared by the benchmark scripts: alternating timing, median ratios, tables, machine info.

The benchmarks run on shared, possibly busy machines, so absolute rates drift. What they report
as the result is always a ratio measured side by side: the contenders are run alternately within
one process (A B, B A, A B, ...) and the per-repetition ratios are summarised by their median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from aa_ray.tracking.machine import cpu_model  # noqa: F401  (the one reader, re-exported for the scripts)

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"


def git_state() -> str:
    """The commit measured, and whether aa_ray/ differed from it (benchmarks measure the working tree)."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "aa_ray", "specs")
    return commit + (" + uncommitted changes in aa_ray/ or specs/" if dirty else "")


def machine_info() -> dict[str, Any]:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m_at_start": round(load[0], 2),
        "git": git_state(),
    }


def print_machine(info: dict[str, Any]) -> None:
    print(
        f"# {info['date']}  nproc={info['nproc']}  cpu={info['cpu']}  python {info['python']}  "
        f"torch {info['torch']} (threads={info['torch_threads']})  load(1m)={info['loadavg_1m_at_start']}"
    )
    print(f"# code: {info['git']}")
    if info["loadavg_1m_at_start"] > 0.75 * (info["nproc"] or 1):
        print(f"# WARNING: the machine is busy (load {info['loadavg_1m_at_start']} on {info['nproc']} CPUs): rates "
              "drift and Ray actors (nice 15) lose CPU to other nice-0 processes; prefer a quiet machine")


def alternate(contenders: Sequence[tuple[str, Callable[[], float]]], reps: int, verbose: bool = True
              ) -> dict[str, list[float]]:
    """Run every contender once per repetition, alternating (A B C, then C B A, then A B C, ...:
    the order flips every repetition so that no contender always runs first or right after the
    same neighbour); each call returns a rate (higher is better). Returns the rates per
    contender, one per repetition, so rates[x][i] and rates[y][i] were measured back to back."""
    rates: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for rep in range(reps):
        for name, fn in contenders if rep % 2 == 0 else list(reversed(contenders)):
            rate = fn()
            rates[name].append(rate)
            if verbose:
                print(f"  rep {rep + 1}/{reps}  {name:<34s} {rate:10.1f}", flush=True)
    return rates


def median_ratio(rates: dict[str, list[float]], num: str, den: str) -> float:
    """Median over repetitions of rate[num] / rate[den] (the two were measured back to back)."""
    return statistics.median(a / b for a, b in zip(rates[num], rates[den], strict=True))


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |")


SMOKE_HELP = ("the smallest cell, seconds long: the script's path end to end, as CI runs it "
              "(tests/test_benchmarks_run.py); its numbers are not results")
NO_SB3 = ("# stable-baselines3 is not installed (it comes with the bench extra: pip install -e '.[bench]'): "
          "its contender is left out")


def base_parser(description: str, reps: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=reps, help="alternating repetitions per contender")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    add_smoke(parser)
    return parser


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def sb3_installed() -> bool:
    """Stable-Baselines3 is the reference of several benchmarks, installed by the bench extra only:
    without it they time aa-ray's side and say so (NO_SB3)."""
    import importlib.util

    return importlib.util.find_spec("stable_baselines3") is not None


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(payload, indent=2, default=str))


def command_line() -> str:
    return " ".join([".venv/bin/python", *[a for a in sys.argv if a]])


def random_transitions(n: int, obs_dim: int, act_dim: int, seed: int = 0) -> Any:
    """`n` replay rows of random transitions (rewards in pusher-reach's range): learner benchmarks
    time the update, so the data only needs the right shapes and plausible scales."""
    import numpy as np

    from aa_ray.records import Transitions

    rng = np.random.default_rng(seed)
    return Transitions(
        obs=rng.normal(size=(n, obs_dim)).astype(np.float32),
        action=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
        reward=-rng.uniform(0, 0.3, n).astype(np.float32),
        next_obs=rng.normal(size=(n, obs_dim)).astype(np.float32),
        terminated=np.zeros(n, np.float32),
        truncated=np.zeros(n, np.float32),
        discount=np.full(n, 0.99, np.float32),
    )


def run_part(args: argparse.Namespace, parts: dict[str, Any]) -> None:
    """Print the machine, run the `--part` the command line chose, and write `--json` if asked."""
    info = machine_info()
    print_machine(info)
    write_json(args.json, {"machine": info, **parts[args.part](args)})


def stop_when(trainer: Any, expired: Callable[[int], bool], reason: str) -> bool:
    """Make the trainer's cadence stop the run, after one last evaluation, at the first iteration
    where `expired(env_steps)` is true (e.g. a wall-clock slice); the run's result then says
    `reason`. False where the trainer keeps no cadence of the expected kind (only the budget stops
    the run then)."""
    from aa_ray.runtime.cadence import Cadence, Due, Outcome

    cadence = getattr(getattr(trainer, "state", None), "cadence", None)  # the driver's state owns the cadence
    if not isinstance(cadence, Cadence):
        return False

    class StoppingCadence(type(cadence)):  # type: ignore[misc]
        stopping = False

        def due(self, env_steps: int) -> Due:
            due = super().due(env_steps)
            if expired(env_steps):
                self.stopping = True
                return Due(evaluate=True, checkpoint=False, budget_spent=due.budget_spent)
            return due

        def outcome(self, env_steps: int, due: Due, evaluation: dict[str, float] | None) -> Outcome:
            outcome = super().outcome(env_steps, due, evaluation)
            if self.stopping and outcome.stop_reason is None:
                return Outcome(stop_reason=reason, checkpoint=False, report=False)
            return outcome

    cadence.__class__ = StoppingCadence  # keeps the cadence's state, adds the stop
    return True


class HostReads:
    """Counts tensor values read on the host (`.item()`, `float(t)`, `bool(t)`, `.tolist()`, ...)
    while active: on a GPU each one waits for the device. Use as `with HostReads() as reads:`."""

    READS = frozenset({"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"})

    def __init__(self) -> None:
        from torch.overrides import TorchFunctionMode

        counter = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
                if getattr(func, "__name__", "") in HostReads.READS:
                    counter.names.append(func.__name__)
                return func(*args, **(kwargs or {}))

        self.mode, self.names = Mode(), []

    def __enter__(self) -> HostReads:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)

    @property
    def count(self) -> int:
        return len(self.names)
