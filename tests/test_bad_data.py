"""Bad values and bad paths found at the door (issue 26, item 3): a prior dataset or a checkpoint's
replay file holding NaN, infinite, empty or out-of-range values is refused on load, before any actor
starts, in one message naming the file, the column and the first bad row; `aa-ray eval` and `aa-ray
export` refuse a policy whose weights are not finite; `aa-ray export` makes a missing folder, or says
in one message why it cannot. All on real files: datasets written by the dataset writer, a
checkpoint of a short inline training run, damaged the way a diverged run or a foreign tool would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from test_api import INLINE, SPECS
from test_datasets import fake_transitions, pusher_meta, rlpd_overrides

from aa_ray.api import Experiment, ExportError, load_policy
from aa_ray.data import dataset as ds
from aa_ray.data.dataset import DatasetError, write_dataset
from aa_ray.data.sources import read_dataset
from aa_ray.runtime.checkpoint import REPLAY_FILE, STATE_FILE, CheckpointError
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec


def aa_ray_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`aa-ray ARGS` as a user runs it, in a fresh interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "aa_ray.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def assert_one_message(result: subprocess.CompletedProcess, *expected: str) -> str:
    """A refused command: exit code 2, one `aa-ray: error:` line that says each of `expected`."""
    error = result.stderr
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], error[-3000:])
    assert "Traceback" not in error and error.count("\n") == 1 and error.startswith("aa-ray: error: "), error
    for text in expected:
        assert text in error, (text, error)
    return error


# ---- prior datasets -------------------------------------------------------------------------------


def with_value(column: str, row: int, value: float, n: int = 50) -> dict:
    """`fake_transitions(n)` with one value replaced (the first feature of a vector column)."""
    transitions = fake_transitions(n)
    data = transitions[column]
    if data.ndim == 2:
        data[row, min(1, data.shape[1] - 1)] = value
    else:
        data[row] = value
    return transitions


BAD_VALUES = [
    (ds.REWARDS, 17, np.nan, "column rewards holds NaN at row 17"),
    (ds.OBS, 3, np.inf, "column obs holds inf at row 3"),
    (ds.NEXT_OBS, 49, -np.inf, "column new_obs holds -inf at row 49"),
    (ds.ACTIONS, 8, 1.5, "column actions holds 1.5, outside the action range [-1, 1] at row 8"),
    (ds.ACTIONS, 0, -1.0001, "column actions holds -1.0001, outside the action range [-1, 1] at row 0"),
]


@pytest.mark.parametrize(("column", "row", "value", "message"), BAD_VALUES)
def test_a_prior_dataset_with_a_bad_value_stops_the_run_before_any_actor_starts(
    tmp_path: Path, column: str, row: int, value: float, message: str
) -> None:
    bad = write_dataset(tmp_path / "bad.parquet", with_value(column, row, value), pusher_meta())
    trainer = Trainer(load_spec(SPECS / "rlpd.yaml", rlpd_overrides(bad)), live=False)
    with pytest.raises(DatasetError) as err:
        trainer.run()
    assert str(err.value).startswith(f"algo.prior_data: dataset file {bad}: {message}; "), str(err.value)
    assert trainer.graph is None and not ray.is_initialized()


def test_good_values_pass_actions_at_the_bounds_included(tmp_path: Path) -> None:
    transitions = fake_transitions(50)
    transitions[ds.ACTIONS][:2] = [[-1.0, 1.0], [1.0, -1.0]]  # tanh saturated: what a policy does emit
    read_dataset(write_dataset(tmp_path / "good.parquet", transitions, pusher_meta())).check_values()


def test_the_row_counts_from_the_start_of_its_file_across_batches_and_files(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    write_dataset(folder / "part-0.parquet", fake_transitions(100), pusher_meta())
    second = write_dataset(folder / "part-1.parquet", with_value(ds.REWARDS, 77, np.nan, n=100), pusher_meta())
    with pytest.raises(DatasetError, match=rf"^dataset file {second}: column rewards holds NaN at row 77; "):
        read_dataset(folder).check_values(batch_rows=16)  # the bad row is in the 5th batch of the 2nd file


def test_grouped_observations_name_the_key_and_empty_values_are_refused(tmp_path: Path) -> None:
    meta = replace(pusher_meta(), obs_groups=(("a", 1), ("b", 9)))  # feature 1, the one made NaN, is b's
    grouped = write_dataset(tmp_path / "grouped.parquet", with_value(ds.NEXT_OBS, 5, np.nan), meta)
    with pytest.raises(DatasetError, match=r"column new_obs/b holds NaN at row 5"):
        read_dataset(grouped).check_values()

    table = pq.read_table(write_dataset(tmp_path / "good.parquet", fake_transitions(50), pusher_meta()))
    rewards = pa.array([None if row == 21 else 0.0 for row in range(50)], pa.float32())
    holed = tmp_path / "holed.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index(ds.REWARDS), ds.REWARDS, rewards), holed)
    with pytest.raises(DatasetError, match=r"column rewards holds an empty \(null\) value at row 21"):
        read_dataset(holed).check_values()


def test_aa_ray_run_with_a_nan_reward_dataset_says_so_in_one_line(tmp_path: Path) -> None:
    bad = write_dataset(tmp_path / "bad.parquet", with_value(ds.REWARDS, 17, np.nan), pusher_meta())
    result = aa_ray_command("run", str(SPECS / "rlpd.yaml"), "--plain", "--set", f"algo.prior_data={bad}",
                            "--set", "tracking.enabled=false", cwd=tmp_path)
    assert_one_message(result, f"algo.prior_data: dataset file {bad}: column rewards holds NaN at row 17")
    assert not (tmp_path / "runs").exists()  # no run folder: nothing started


# ---- a checkpoint and its replay file ---------------------------------------------------------------

TRAIN = {**INLINE, "budget.env_steps": 300, "algo.warm_up_steps": 100, "checkpoint.every_env_steps": None,
         "eval.episodes": 1}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final checkpoint (with its replay file) of a 300-step inline SAC run."""
    output = tmp_path_factory.mktemp("trained") / "runs"
    return Experiment(SPECS / "sac.yaml", {**TRAIN, "runtime.output_dir": str(output)}).fit(progress="plain").checkpoint


@pytest.fixture
def checkpoint(trained: Path, tmp_path: Path) -> Path:
    """The trained checkpoint in a copy of its run folder, for a test to damage."""
    run = trained.parents[1]
    return Path(shutil.copytree(run, tmp_path / "runs" / run.name)) / trained.relative_to(run)


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def damage_replay(checkpoint: Path, column: str, row: int, value: float) -> Path:
    """Write the replay file again with one value replaced (its metadata and row count kept)."""
    file = checkpoint / REPLAY_FILE
    table = pq.read_table(file)
    data = table.column(column).combine_chunks()
    if isinstance(data.type, pa.FixedSizeListType):
        values = data.flatten().to_numpy().copy()
        values[row * data.type.list_size] = value
        replaced = pa.FixedSizeListArray.from_arrays(pa.array(values), data.type.list_size)
    else:
        values = data.to_numpy().copy()
        values[row] = value
        replaced = pa.array(values)
    table = table.set_column(table.schema.get_field_index(column), column, replaced)
    assert table.schema.metadata.get(b"aa_ray.replay")  # still a replay table of these dims
    pq.write_table(table, file)
    return file


@pytest.mark.parametrize(("column", "row", "value", "message"), [
    ("reward", 5, np.nan, "column reward holds NaN at row 5"),
    ("next_obs", 250, np.inf, "column next_obs holds inf at row 250"),
    ("action", 9, -3.0, "column action holds -3, outside the action range [-1, 1] at row 9"),
])
def test_a_resume_from_a_replay_file_with_a_bad_value_is_refused_before_any_actor_starts(
    checkpoint: Path, tmp_path: Path, column: str, row: int, value: float, message: str
) -> None:
    file = damage_replay(checkpoint, column, row, value)
    before = files_under(tmp_path)
    experiment = Experiment(SPECS / "sac.yaml", {**TRAIN, "runtime.output_dir": str(tmp_path / "runs"),
                                                 "budget.env_steps": 600})
    with pytest.raises(CheckpointError) as err:
        experiment.fit(resume=checkpoint, progress="plain")
    assert str(err.value).startswith(f"replay file {file}: {message}, "), str(err.value)
    assert "resume with an empty buffer that refills: --resume-without-replay" in str(err.value)
    assert experiment.trainer.graph is None and files_under(tmp_path) == before  # nothing started or written


def test_a_good_replay_file_resumes(checkpoint: Path, tmp_path: Path) -> None:
    """The check refuses bad values only: the same checkpoint, undamaged, trains on."""
    result = Experiment(SPECS / "sac.yaml", {**TRAIN, "runtime.output_dir": str(tmp_path / "runs"),
                                             "budget.env_steps": 400}).fit(resume=checkpoint, progress="plain")
    assert result.env_steps >= 400


def test_aa_ray_run_resuming_a_nan_replay_file_says_so_in_one_line(checkpoint: Path, tmp_path: Path) -> None:
    file = damage_replay(checkpoint, "obs", 0, np.nan)
    settings = [arg for key, value in {**TRAIN, "budget.env_steps": 600}.items()
                for arg in ("--set", f"{key}={'null' if value is None else value}")]
    result = aa_ray_command("run", str(SPECS / "sac.yaml"), "--plain", *settings, "--resume", str(checkpoint),
                            cwd=tmp_path)
    assert_one_message(result, f"replay file {file}: column obs holds NaN at row 0")


# ---- policies with non-finite weights -------------------------------------------------------------


def poison_policy(checkpoint: Path, tensor: str, value: float) -> None:
    """Write the checkpoint's state file again with one value of a policy tensor replaced."""
    payload = torch.load(checkpoint / STATE_FILE, weights_only=True)
    payload["learner"]["algo"]["policy"][tensor].view(-1)[0] = value
    torch.save(payload, checkpoint / STATE_FILE)


@pytest.mark.parametrize(("tensor", "value"), [("actor.net.2.weight", np.nan), ("obs_norm.var", np.inf)])
def test_load_policy_refuses_non_finite_weights_naming_checkpoint_and_tensor(
    checkpoint: Path, tensor: str, value: float
) -> None:
    load_policy(checkpoint)  # the undamaged policy loads
    poison_policy(checkpoint, tensor, value)
    with pytest.raises(CheckpointError, match=rf"^checkpoint {checkpoint}: its policy is not finite: tensor "
                                              rf"{tensor} holds 1 NaN or infinite values of \d+\."):
        load_policy(checkpoint)


def test_eval_and_export_of_a_nan_policy_refuse_and_write_nothing(checkpoint: Path, tmp_path: Path) -> None:
    poison_policy(checkpoint, "actor.net.0.bias", np.nan)
    expected = (f"checkpoint {checkpoint}: its policy is not finite: tensor actor.net.0.bias", "earlier checkpoint")
    assert "eval/" not in assert_one_message(aa_ray_command("eval", str(checkpoint), cwd=tmp_path), *expected)
    out = tmp_path / "exported" / "policy.pt"
    assert_one_message(aa_ray_command("export", str(checkpoint), "--format", "torchscript", "--out", str(out),
                                      cwd=tmp_path), *expected)
    assert not out.parent.exists()


# ---- where an export goes ---------------------------------------------------------------------------


def test_export_into_a_missing_folder_makes_it(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "policy.pt"
    result = aa_ray_command("export", str(checkpoint), "--format", "torchscript", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["policy.pt"]  # no .partial left
    obs = torch.zeros(3, load_policy(checkpoint).obs_dim)
    assert torch.jit.load(str(out))(obs).shape == (3, load_policy(checkpoint).act_dim)


def test_export_under_a_file_says_why_in_one_message_and_writes_nothing(checkpoint: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "sub" / "policy.onnx"
    result = aa_ray_command("export", str(checkpoint), "--format", "onnx", "--out", str(out), cwd=tmp_path)
    assert_one_message(result, f"cannot write the policy file {out}: {blocker} is a file, not a folder")
    assert blocker.read_text() == "a file, not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: no permission to be refused")
def test_export_into_a_folder_it_may_not_write_says_why(checkpoint: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    out = locked / "policy.pt"
    with pytest.raises(ExportError, match=rf"^cannot write the policy file {out}: Permission denied\.$"):
        load_policy(checkpoint).export(out, "torchscript")
    assert not list(locked.iterdir())
