"""The edges of stopping and resuming a run (issue 34, item 5): real signals to a real `aa-ray run`
process, a checkpoint whose replay file is gone, `--resume latest` after the algo changed, an MLflow
store that cannot be written, MuJoCo's model warnings. Runs use the inline backend (no Ray; but for
the warnings Ray forwarded) and tiny networks: each subprocess is a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aa_ray.runtime.checkpoint import REPLAY_FILE, load_checkpoint
from aa_ray.runtime.stop_signals import StopSignals

SPEC = Path(__file__).resolve().parents[1] / "specs" / "sac.yaml"
TINY = [
    "runtime.backend=inline", "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]",
    "algo.batch_size=32", "algo.warm_up_steps=200", "eval.episodes=1", "eval.every_env_steps=300",
    "checkpoint.every_env_steps=300", "budget.env_steps=600",
]


def command(*extra: str, sets: list[str] = TINY) -> list[str]:
    return [sys.executable, "-m", "aa_ray.cli", "run", str(SPEC), "--plain",
            *[arg for item in sets for arg in ("--set", item)], *extra]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


def complete(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("runs/*/checkpoints/*") if not p.name.endswith((".partial", ".previous")))


# ---- signals ------------------------------------------------------------------------------------

def test_a_repeated_sigterm_is_one_notice_and_a_second_sigint_stops_at_once() -> None:
    """In this process, with real signals: SIGTERM twice asks once (a scheduler may send its notice
    again), Ctrl-C after it stops at once, and inside a checkpoint write the stop waits for the write."""
    stops = StopSignals(grace_s=60)
    with stops.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        except KeyboardInterrupt:
            pytest.fail("a repeated SIGTERM stopped at once")
        assert stops.received == "SIGTERM"
        written = []
        with pytest.raises(KeyboardInterrupt, match="second stop signal"), stops.writing():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            written.append("the rest of the write")
        assert written
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)


def run_in_background(folder: Path, *sets: str) -> subprocess.Popen[str]:
    run = subprocess.Popen(command(sets=[*TINY, *sets]), cwd=folder, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    # the run folder's spec.yaml is written once the actors are up, just before training starts
    wait_for(lambda: any(folder.glob("runs/*/spec.yaml")) or run.poll() is not None, "the run to start")
    assert run.poll() is None, run.communicate()[1][-3000:]
    time.sleep(1.0)
    return run


def test_two_sigterms_stop_once_with_a_checkpoint(tmp_path: Path) -> None:
    """A preemption notice sent twice, 0.1 s apart: one graceful stop (checkpoint, exit 75)."""
    run = run_in_background(tmp_path, "budget.env_steps=100000", "checkpoint.every_env_steps=100000")
    run.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 75, err[-3000:]
    [event] = [json.loads(line) for line in next(tmp_path.glob("runs/*/events.jsonl")).read_text().splitlines()]
    assert event["event"] == "preempted" and event["signal"] == "SIGTERM"
    assert load_checkpoint(event["checkpoint"]).driver.counters.env_steps > 0


def test_ctrl_c_during_the_checkpoint_write_leaves_it_whole(tmp_path: Path) -> None:
    """SIGTERM, then SIGINT while the checkpoint it asked for is being written (large networks make
    the write long enough to land in): the run stops at once (130), after the write is complete."""
    big = "[1024,1024]"
    run = run_in_background(tmp_path, "budget.env_steps=100000", "checkpoint.every_env_steps=100000",
                            "algo.warm_up_steps=90000", f"algo.actor_hidden_dims={big}",
                            f"algo.critic_hidden_dims={big}")
    run.send_signal(signal.SIGTERM)
    wait_for(lambda: any(tmp_path.glob("runs/*/checkpoints/*.partial")) or run.poll() is not None,
             "the checkpoint write to start", every_s=0.001)  # to land inside the write
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert not list(tmp_path.glob("runs/*/checkpoints/*.partial"))
    [checkpoint] = complete(tmp_path)
    assert (checkpoint / REPLAY_FILE).is_file() and load_checkpoint(checkpoint).driver.counters.env_steps > 0
    assert f"last checkpoint: {checkpoint.relative_to(tmp_path)}" in err


# ---- resuming ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (600 env steps, untracked): its folder holds runs/<run>/checkpoints/final."""
    folder = tmp_path_factory.mktemp("finished")
    done = subprocess.run(command("--no-track"), cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "runs"


def copy_of(runs: Path, folder: Path) -> Path:
    shutil.copytree(runs, folder / "runs")
    [final] = (folder / "runs").glob("*/checkpoints/final")
    return final


def test_a_checkpoint_whose_replay_file_is_gone_resumes_only_when_asked(finished_run: Path, tmp_path: Path) -> None:
    """Refused in one paragraph naming the missing file (nothing started, nothing written), and
    resumed with an empty buffer under --resume-without-replay, which events.jsonl records."""
    final = copy_of(finished_run, tmp_path)
    (final / REPLAY_FILE).unlink()
    before = sorted(tmp_path.rglob("*"))
    longer = [*TINY, "budget.env_steps=900"]
    refused = subprocess.run(command("--no-track", "--resume", str(final), sets=longer), cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.startswith(f"aa-ray: error: replay file {final / REPLAY_FILE} is missing")
    assert "--resume-without-replay" in refused.stderr and "Traceback" not in refused.stderr
    assert sorted(tmp_path.rglob("*")) == before

    resumed = subprocess.run(command("--no-track", "--resume", str(final), "--resume-without-replay", sets=longer),
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = [json.loads(line) for line in (final.parent.parent / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["resumed_without_replay"]
    assert events[0]["checkpoint"] == str(final) and events[0]["replay_rows_left_out"] >= 600
    assert load_checkpoint(final).driver.counters.env_steps >= 900


def test_resume_latest_after_the_algo_changed_starts_a_new_run(finished_run: Path, tmp_path: Path) -> None:
    """`--resume latest` with another algo finds no run of this spec and starts one, saying so in a
    line; the same spec with a longer budget then still finds the first run, past the newer one."""
    final = copy_of(finished_run, tmp_path)
    other = subprocess.run(command("--no-track", "--resume", "latest", sets=[*TINY, "algo.name=td3"]), cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert other.returncode == 0, other.stderr[-3000:]
    assert (f"no run of sac_pusher under runs was trained with this env and algo (the newest, {final.parts[-3]}, "
            "differs in algo.") in other.stdout
    assert "starting a new run" in other.stdout
    assert len(list((tmp_path / "runs").iterdir())) == 2

    longer = subprocess.run(command("--no-track", "--resume", "latest", sets=[*TINY, "budget.env_steps=900"]),
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert f"resuming from {final.relative_to(tmp_path)}" in longer.stdout


# ---- an MLflow store that cannot be written ------------------------------------------------------

def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write to: made read-only, or (as root, whom permissions do not
    stop) /sys, which the kernel refuses files in."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if not os.access(folder, os.W_OK):
        return folder
    if os.path.isdir("/sys") and _refuses_files("/sys"):
        return Path("/sys")
    pytest.skip("no read-only folder here (root, and /sys accepts files)")


def _refuses_files(folder: str) -> bool:
    try:
        with tempfile.TemporaryFile(dir=folder):
            return False
    except OSError:
        return True


def refused_in_one_paragraph(uri: str, folder: Path, names: Path) -> None:
    # MLflow's own retries took 109 s to give up on such a store
    run = subprocess.run(command(), cwd=folder, capture_output=True, text=True, timeout=90,
                         env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.startswith(f"aa-ray: error: MLflow tracking store {names} ")
    assert "cannot be written" in run.stderr and "--no-track" in run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1
    assert not (folder / "runs").exists()


def test_a_sqlite_store_in_a_read_only_folder_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    store = read_only_folder(tmp_path) / "mlflow.db"
    refused_in_one_paragraph(f"sqlite:///{store}", tmp_path, store)


def test_a_read_only_sqlite_file_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")
    store.chmod(0o444)
    if os.access(store, os.W_OK):
        pytest.skip("running as root: a read-only file is still writable")
    refused_in_one_paragraph(f"sqlite:///{store}", tmp_path, store)


# ---- MuJoCo's model warnings -------------------------------------------------------------------

SETTOTALMASS = "compiler attribute 'settotalmass' is deprecated"  # in gymnasium's half_cheetah.xml


def mujoco_warns_of_settotalmass() -> bool:
    """Whether this MuJoCo warns when it compiles gymnasium's HalfCheetah (4.0 does; 3.11, which UniLab's
    extra pins, does not)."""
    import gymnasium
    import mujoco

    seen: list[str] = []
    mujoco.set_mju_user_warning(seen.append)
    try:
        mujoco.MjModel.from_xml_path(str(Path(gymnasium.__file__).parent / "envs/mujoco/assets/half_cheetah.xml"))
    finally:
        mujoco.set_mju_user_warning(None)
    return any("settotalmass" in message for message in seen)


def test_making_many_mujoco_envs_warns_once_per_process(capfd: pytest.CaptureFixture[str]) -> None:
    """64 HalfCheetah copies, then more for evaluation and a video: MuJoCo's deprecation warning
    once, and MuJoCo's own handler back after each (warnings while stepping still reach it)."""
    import mujoco

    from aa_ray.envs import make_env, make_vector_env
    from aa_ray.spec.loader import load_spec

    spec = load_spec(SPEC, ["env.id=HalfCheetah-v5"])
    for envs in (make_vector_env(spec, 64), make_vector_env(spec, 8), make_env(spec)):
        envs.close()
        assert mujoco.get_mju_user_warning() is None
    out, err = capfd.readouterr()
    assert (out + err).count(SETTOTALMASS) <= 1, err[-2000:]


def test_a_ray_run_of_many_mujoco_envs_shows_the_warning_once(tmp_path: Path) -> None:
    """Two Ray runners of 8 HalfCheetah envs each, plus their evaluation envs: one line in the
    run's output (the driver's), none forwarded from the runners."""
    if not mujoco_warns_of_settotalmass():
        pytest.skip("this MuJoCo compiles HalfCheetah without a warning: there is none to show once")
    sets = [*TINY, "runtime.backend=ray", "env.id=HalfCheetah-v5", "runners.num_runners=2",
            "runners.envs_per_runner=8", "budget.env_steps=400", "eval.every_env_steps=400"]
    run = subprocess.run(command("--no-track", sets=sets), cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (run.stdout + run.stderr).count(SETTOTALMASS) == 1, run.stderr[-3000:]
