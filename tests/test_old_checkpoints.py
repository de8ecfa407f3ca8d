"""Checkpoints written before the redesign (format 2, the old knob names; made by aa-ray at commit
fd87d19 and kept in tests/fixtures/format2) still resume and roll out with today's aa-ray, and every
older format reads as today's typed `records.Checkpoint` (`checkpoint._todays_checkpoint`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aa_ray.records import CheckpointParts, DriverCheckpoint, LearnerState, NormMoments, RunCounters
from aa_ray.runtime.checkpoint import (
    FORMAT_VERSION,
    STATE_FILE,
    CheckpointError,
    check_compatible,
    load_checkpoint,
    save_checkpoint,
)
from aa_ray.spec.loader import load_spec, spec_to_dict

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "format2"
# what the format-2 sac checkpoint was trained with, in today's names
SAC_AS_TRAINED = [
    "algo.actor_hidden_dims=[8]", "algo.critic_hidden_dims=[8]", "algo.warm_up_steps=100", "algo.batch_size=16",
    "algo.buffer_size=400", "eval.episodes=1", "checkpoint.every_env_steps=null",
]


def aa_ray(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "aa_ray.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_format2_sac_checkpoint_resumes_under_the_new_knob_names(tmp_path: Path) -> None:
    run_dir = tmp_path / "old_run"
    shutil.copytree(FIXTURES / "sac", run_dir / "checkpoints" / "final")
    overrides = [arg for knob in SAC_AS_TRAINED for arg in ("--set", knob)]
    result = aa_ray(
        "run", str(ROOT / "specs" / "sac.yaml"), *overrides, "--set", "budget.env_steps=500", "--no-track", "--plain",
        "--set", "runtime.backend=inline",  # a checkpoint is read alike on both backends
        "--resume", str(run_dir / "checkpoints" / "final"), cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = load_checkpoint(run_dir / "checkpoints" / "final")
    assert resumed.written_format == FORMAT_VERSION
    assert resumed.driver.counters.env_steps >= 500  # it went on from the old checkpoint's 300 env steps
    assert resumed.spec["algo"]["critic_hidden_dims"] == [8]


def test_a_format3_checkpoint_from_before_a_new_knob_resumes(tmp_path: Path) -> None:
    """A checkpoint written before `algo.sym_aug` existed (its stored algo section lacks the knob)
    still fits a spec that leaves the knob at its default, and is refused by one that sets it."""
    spec = load_spec(ROOT / "specs" / "sac.yaml")
    stored = spec_to_dict(spec)
    del stored["algo"]["sym_aug"], stored["runtime"]["trace"]
    torch.save({"format_version": FORMAT_VERSION, "spec": stored}, tmp_path / "state.pt")
    check_compatible(spec, load_checkpoint(tmp_path))
    with pytest.raises(CheckpointError, match="algo.sym_aug: checkpoint has False, spec has True"):
        check_compatible(load_spec(ROOT / "specs" / "sac.yaml", ["algo.sym_aug=true"]), load_checkpoint(tmp_path))


def test_a_format2_checkpoint_with_other_networks_is_refused_naming_the_knob(tmp_path: Path) -> None:
    run_dir = tmp_path / "old_run"
    shutil.copytree(FIXTURES / "sac", run_dir / "checkpoints" / "final")
    overrides = [arg for knob in SAC_AS_TRAINED for arg in ("--set", knob)]
    result = aa_ray(
        "run", str(ROOT / "specs" / "sac.yaml"), *overrides, "--set", "algo.critic_hidden_dims=[16]", "--no-track",
        "--resume", str(run_dir / "checkpoints" / "final"), cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "algo.critic_hidden_dims: checkpoint has [8], spec has [16]" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["ppo", "sac_simba"])
def test_a_format2_checkpoint_rolls_out(tmp_path: Path, name: str) -> None:
    spec = ROOT / "specs" / f"{name}.yaml"
    out = tmp_path / "episodes.parquet"
    result = aa_ray(
        "rollout", str(spec), "--episodes", "2", "--out", str(out), "--checkpoint", str(FIXTURES / name),
        "--set", "runtime.backend=inline", cwd=tmp_path,  # a checkpoint is read alike on both backends
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.is_file()


def test_a_checkpoint_of_an_unknown_format_is_refused_naming_its_version(tmp_path: Path) -> None:
    payload = torch.load(FIXTURES / "sac" / "state.pt", weights_only=True)
    payload["format_version"] = FORMAT_VERSION + 1
    (tmp_path / "ckpt").mkdir()
    torch.save(payload, tmp_path / "ckpt" / "state.pt")
    with pytest.raises(CheckpointError, match=rf"format version {FORMAT_VERSION + 1}"):
        load_checkpoint(tmp_path / "ckpt")


def saved_as(tmp_path: Path, name: str, edit) -> Path:
    """The format-2 sac checkpoint's state file, edited into another format's layout."""
    payload = torch.load(FIXTURES / "sac" / STATE_FILE, weights_only=True)
    edit(payload)
    (tmp_path / name).mkdir()
    torch.save(payload, tmp_path / name / STATE_FILE)
    return tmp_path / name


def test_every_older_format_reads_as_todays_checkpoint(tmp_path: Path) -> None:
    format2 = load_checkpoint(FIXTURES / "sac")
    raw = torch.load(FIXTURES / "sac" / STATE_FILE, weights_only=True)
    assert format2.written_format == 2 and format2.folder == FIXTURES / "sac"
    assert isinstance(format2.learner, LearnerState) and format2.learner.noise_generator is None
    assert format2.learner.gradient_updates == raw["learner"]["critic_updates"]  # the count's name before families
    assert torch.equal(format2.learner.global_cpu_generator, raw["learner"]["torch_rng"])
    assert format2.driver.counters == RunCounters(env_steps=304, iterations=31, episodes=6, next_eval=1000)
    assert all(isinstance(moments, NormMoments) for moments in format2.driver.pending_stats)
    assert format2.replay_rows == 304 and format2.tracking == {} and len(format2.runners) == 1

    def format3_tracked(payload: dict) -> None:
        payload.update(format_version=3, mlflow_run_id="0123abcd")

    assert load_checkpoint(saved_as(tmp_path, "v3", format3_tracked)).tracking == {"mlflow": "0123abcd"}

    def format1(payload: dict) -> None:  # the runners' random streams only, no driver part
        payload["format_version"] = 1
        payload["runner_rng"] = [{"numpy": r["numpy_rng"], "torch": r["torch_rng"]} for r in payload.pop("runners")]
        del payload["driver"], payload["replay_rows"]

    format1 = load_checkpoint(saved_as(tmp_path, "v1", format1))
    assert [set(state) for state in format1.runners] == [{"numpy_rng", "torch_rng"}]
    assert format1.driver == DriverCheckpoint(format2.driver.counters, [], [], {})  # the averages start over
    assert format1.replay_rows is None


def test_a_checkpoint_round_trips_its_typed_parts(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "specs" / "sac.yaml")
    learner = LearnerState(algo={"policy": {"w": torch.ones(2)}}, weights_version=3, gradient_updates=7,
                           noise_generator=torch.Generator().get_state())
    moments = NormMoments((2, np.zeros(3), np.ones(3)), (2, 0.5, 1.0, 2.0))
    driver = DriverCheckpoint(RunCounters(100, 10, 2, 500), [moments], [1.5, -2.0], {"success": [1.0]})
    parts = CheckpointParts(learner=learner, replay={"cursor": 5}, runners=[{"numpy_rng": {}}], driver=driver,
                            tracking={"mlflow": "abc", "tensorboard": "runs/x/tensorboard", "wandb": "w1"})
    read = load_checkpoint(save_checkpoint(tmp_path / "ckpt", spec, parts))
    assert read.written_format == FORMAT_VERSION and read.replay_rows is None
    assert read.tracking == parts.tracking and read.replay == {"cursor": 5} and read.runners == [{"numpy_rng": {}}]
    assert (read.learner.weights_version, read.learner.gradient_updates) == (3, 7)
    assert torch.equal(read.learner.noise_generator, learner.noise_generator)
    assert read.learner.global_cpu_generator is None
    assert read.driver.counters == driver.counters and read.driver.returns == [1.5, -2.0]
    assert read.driver.infos == {"success": [1.0]}
    (saved,) = read.driver.pending_stats
    assert saved.returns == moments.returns and np.array_equal(saved.obs[2], moments.obs[2])


def test_a_checkpoint_with_a_damaged_part_is_refused_naming_the_file(tmp_path: Path) -> None:
    def no_algo(payload: dict) -> None:
        del payload["learner"]["algo"]

    folder = saved_as(tmp_path, "damaged", no_algo)
    with pytest.raises(CheckpointError, match=r"damaged or was not written by aa-ray .*KeyError: 'algo'") as err:
        load_checkpoint(folder)
    assert str(folder / STATE_FILE) in str(err.value)
