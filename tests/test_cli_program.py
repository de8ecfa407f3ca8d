"""The `aa-ray` program, as a process of its own, freezes the objects its imports built before it runs
(benchmarks/RESULTS.md section 38); `cli.main`, called in a caller's process, leaves that process's
garbage collector as it was."""

from __future__ import annotations

import gc
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from aa_ray import cli

SPEC = Path(__file__).resolve().parents[1] / "specs" / "sac.yaml"


def test_the_console_script_is_the_program() -> None:
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="aa-ray")
    assert script.value == "aa_ray.cli:command"


def test_the_program_freezes_what_its_imports_built_and_runs_the_command() -> None:
    code = ("import gc, sys\nfrom aa_ray import cli\nsys.argv = ['aa-ray', 'validate', sys.argv[1]]\n"
            "status = cli.command()\nprint('frozen', gc.get_freeze_count(), 'status', status)")
    done = subprocess.run([sys.executable, "-c", code, str(SPEC)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    frozen, status = done.stdout.split("frozen ")[1].split(" status ")
    assert int(status) == 0 and "sac" in done.stdout
    assert int(frozen) > 100_000, done.stdout  # torch's and pydantic's objects, at the least


def test_main_in_a_callers_process_leaves_its_collector_alone() -> None:
    before = gc.get_freeze_count()
    assert cli.main(["validate", str(SPEC)]) == 0
    assert gc.get_freeze_count() == before and gc.isenabled()
