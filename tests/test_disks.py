"""Disks as they are: an output folder that cannot be written is refused before any actor starts, old
checkpoints are pruned (`checkpoint.keep_last`), and a disk that fills up mid-run, here a real tmpfs
mounted by the test, stops the run with one message saying what filled up and where, removes the
half-written checkpoint and keeps the previous one."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aa_ray.runtime.checkpoint import REPLAY_FILE, load_checkpoint

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = [
    "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]", "algo.batch_size=64",
    "algo.warm_up_steps=200", "algo.train_every=5", "runners.num_runners=1", "eval.every_env_steps=100000",
    "tracking.enabled=false", "runtime.backend=inline",
]


def aa_ray_run(*overrides: str) -> list[str]:
    settings = [arg for item in [*SMALL, *overrides] for arg in ("--set", item)]
    return [sys.executable, "-m", "aa_ray.cli", "run", str(SPECS / "sac.yaml"), "--plain", *settings]


def complete(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*/checkpoints/step_*") if "." not in p.name)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs: room for a few small checkpoints, full once the test writes a ballast file."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> None:
    """Write a ballast file until the file system refuses more."""
    chunk = b"\0" * 2**16
    with open(disk / "ballast", "wb", buffering=0) as ballast:
        try:
            while True:
                ballast.write(chunk)
        except OSError:
            pass


def test_an_output_folder_that_cannot_be_written_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the run folder would go")
    started = time.monotonic()
    run = subprocess.run(aa_ray_run("runtime.output_dir=taken/runs", "budget.env_steps=400"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "runtime.output_dir" in run.stderr and "taken" in run.stderr and "is a file" in run.stderr
    assert time.monotonic() - started < 60 and not list(tmp_path.glob("taken*/**/checkpoints"))


def test_a_full_disk_stops_the_run_cleanly_and_keeps_the_previous_checkpoint(small_disk: Path) -> None:
    run = subprocess.Popen(
        aa_ray_run(f"runtime.output_dir={small_disk}", "budget.env_steps=100000", "checkpoint.every_env_steps=100",
                   "checkpoint.keep_last=2"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 240
    while not _pruned(small_disk):
        assert run.poll() is None, run.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "timed out waiting for the checkpoints"
        time.sleep(0.1)
    fill(small_disk)
    out, err = run.communicate(timeout=240)

    assert run.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert "is full" in err and str(small_disk) in err and "MiB free" in err, err[-3000:]
    assert not list(small_disk.glob("*/checkpoints/*.partial")), "the half-written checkpoint is left"
    kept = complete(small_disk)
    assert len(kept) == 2 and f"Last checkpoint: {kept[-1]}" in err
    assert load_checkpoint(kept[-1]).driver.counters.env_steps >= 300  # the newest, whole
    assert (kept[-1] / REPLAY_FILE).is_file() and not (kept[0] / REPLAY_FILE).exists()


def _pruned(disk: Path) -> bool:
    """keep_last=2 has removed the first checkpoint (at about 100 env steps)."""
    kept = complete(disk)
    return len(kept) == 2 and int(kept[0].name.removeprefix("step_")) >= 200  # named by its env steps


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real pusher-reach checkpoint (a fresh learner's weights), off the small disk."""
    from aa_ray.records import CheckpointParts, DriverCheckpoint, RunCounters
    from aa_ray.runtime.checkpoint import save_checkpoint
    from aa_ray.runtime.learner import Learner
    from aa_ray.spec.loader import load_spec

    spec = load_spec(SPECS / "sac.yaml", SMALL)
    state = CheckpointParts(learner=Learner(spec, 10, 2).state_dict(),
                            driver=DriverCheckpoint(RunCounters(0, 0, 0, next_eval=1000), [], [], {}))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "final", spec, state)


def one_message(run: subprocess.CompletedProcess, *expected: str) -> str:
    assert run.returncode == 2, (run.stdout + run.stderr)[-3000:]
    err = run.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    for text in expected:
        assert text in err, err
    return err


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_export_onto_a_full_disk_is_one_message_and_leaves_nothing(checkpoint: Path, small_disk: Path,
                                                                   fmt: str) -> None:
    fill(small_disk)
    out = small_disk / "policies" / f"policy.{fmt}"
    export = subprocess.run([sys.executable, "-m", "aa_ray.cli", "export", str(checkpoint), "--format", fmt,
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    one_message(export, "is full", str(out))  # torch.jit's writer used to abort the process (SIGABRT)
    assert sorted(p.name for p in out.parent.iterdir()) == [], "a .partial (or .partial.data) is left"


@pytest.mark.parametrize("fmt", ["parquet", "minari"])
def test_a_rollout_onto_a_full_disk_is_one_message_and_leaves_nothing(small_disk: Path, fmt: str) -> None:
    fill(small_disk)
    out = small_disk / "datasets" / ("pusher.parquet" if fmt == "parquet" else "root")
    settings = [arg for item in SMALL for arg in ("--set", item)]
    rollout = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "rollout", str(SPECS / "sac.yaml"), *settings, "--scripted",
         "--episodes", "4", "--format", fmt, "--out", str(out)], capture_output=True, text=True, timeout=300,
    )
    one_message(rollout, "could not be written", "is full", "nothing of it was left behind")
    left = sorted(str(p.relative_to(small_disk)) for p in small_disk.rglob("*") if p.name != "ballast")
    assert left in ([], ["datasets"]), left  # the Minari root the rollout made is gone too
