"""Checkpoints written before the redesign (format 2, the old knob names; made by aa-ray at commit
fd87d19 and kept in tests/fixtures/format2) still resume and roll out with today's aa-ray."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aa_ray.runtime.checkpoint import FORMAT_VERSION, CheckpointError, check_compatible, load_checkpoint
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
        "--resume", str(run_dir / "checkpoints" / "final"), cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = load_checkpoint(run_dir / "checkpoints" / "final")
    assert resumed["format_version"] == FORMAT_VERSION
    assert resumed["counters"]["env_steps"] >= 500  # it went on from the old checkpoint's 300 env steps
    assert resumed["spec"]["algo"]["critic_hidden_dims"] == [8]


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
        "rollout", str(spec), "--episodes", "2", "--out", str(out), "--checkpoint", str(FIXTURES / name), cwd=tmp_path,
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
