"""Pipelines end to end on a real local Ray, real Tune and a real MLflow store (SQLite in the test's
folder), with tiny budgets; and the bad sweep/pipeline files rejected before anything starts. (A sweep
end to end, with a killed trial and a SIGTERM: test_sweep_resume.py.)"""

from __future__ import annotations

import itertools
import shutil
import traceback
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from ray.exceptions import RayTaskError

from aa_ray import cli
from aa_ray.data.sources import read_dataset
from aa_ray.errors import SpecError
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.spec.experiment import StopAtSpec
from aa_ray.tracking.mlflow_tracker import retry_locked
from aa_ray.tune.pipeline import PipelineError, run_pipeline
from aa_ray.tune.session import error_paragraph
from aa_ray.tune.specs import load_pipeline, load_sweep

SPECS = Path(__file__).resolve().parents[1] / "specs"
# no MLflow Model of the final policy: none is read here (benchmarks/RESULTS.md section 35)
TINY_EVAL = {"eval.every_env_steps": 500, "eval.episodes": 2, "tracking.log_model": False}
TINY_SAC = {"algo.actor_hidden_dims": [32, 32],
    "algo.critic_hidden_dims": [32, 32], "algo.batch_size": 64, "algo.warm_up_steps": 300, **TINY_EVAL}


def write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def children(client: MlflowClient, parent_id: str) -> list:
    experiment = client.get_run(parent_id).info.experiment_id
    return client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")


def test_a_failed_trial_is_one_paragraph_on_the_console() -> None:
    """The trial's own exception and its message's first paragraph, not Ray's remote traceback."""
    try:
        raise ValueError("env.kwargs: no_such_argument\nis not an argument of the env\n\nmore detail")
    except ValueError as cause:
        wrapped = RayTaskError("train", traceback.format_exc(), cause)
    assert error_paragraph(wrapped) == "ValueError: env.kwargs: no_such_argument is not an argument of the env"
    assert error_paragraph(None) == "its error is in the traceback file"


def test_the_shipped_sweep_stops_its_trials_at_5_cm() -> None:
    """specs/sweeps/utd_bee.yaml's comment promises an early stop below 5 cm: every trial has it."""
    sweep = load_sweep(SPECS / "sweeps" / "utd_bee.yaml")
    for utd_ratio, bee_lambda in itertools.product([1, 2], [0.25, 0.5]):
        spec = sweep.trial_spec({"algo.utd_ratio": utd_ratio, "algo.bee_lambda": bee_lambda})
        assert spec.budget.stop_rules == (StopAtSpec(metric="eval/distance", below=0.05),)


def pipeline_document(rlpd_seed: int, rlpd_backend: str) -> dict:
    """PPO trains inline in its trial's process; RLPD in actors of its own where `rlpd_backend` is ray."""
    return {"name": "tiny_rlpd", "stages": {
        "ppo": {"kind": "train", "spec": str(SPECS / "ppo.yaml"), "set": {
            "budget.env_steps": 2048, "algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32],
            "checkpoint.every_env_steps": None, "runtime.backend": "inline", **TINY_EVAL}},
        "rollouts": {"kind": "rollout", "policy": "ppo.checkpoint", "episodes": 6},
        "rlpd": {"kind": "train", "spec": str(SPECS / "rlpd.yaml"), "inputs": {"algo.prior_data": "rollouts.dataset"},
                 "set": {**TINY_SAC, "algo.warm_up_steps": 100, "budget.env_steps": 600, "seed": rlpd_seed,
                         "checkpoint.every_env_steps": None, "runtime.backend": rlpd_backend}},
    }}


@pytest.mark.usefixtures("one_ray")
def test_pipeline_ppo_rollout_rlpd_then_reuse(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """PPO -> rollout (a Parquet dataset of its policy) -> RLPD on that dataset, each stage a Tune
    trial, the first RLPD run's in Ray actors placed in its trial's placement group. A second
    invocation with the RLPD stage changed (and inline) reuses the first two stages and reruns only
    RLPD. Each invocation is one MLflow parent with three children."""
    pipeline_file = write(tmp_path / "pipeline.yaml", pipeline_document(rlpd_seed=0, rlpd_backend="ray"))
    assert cli.main(["pipeline", str(pipeline_file)]) == 0
    first = capsys.readouterr().out
    assert first.count(": running ") == 3 and "reused" not in first

    root = tmp_path / "runs" / "pipelines" / "tiny_rlpd"
    (dataset_file,) = root.glob("rollouts-*/dataset.parquet")
    dataset = read_dataset(dataset_file, expect_env_id="aa_ray/PusherReach-v0")
    assert dataset.num_rows == 6 * 50  # six whole episodes of the 50-step task
    assert Path(dataset.meta.producer).parent.parent.name.startswith("ppo-")  # made by the PPO stage's policy
    (rlpd_checkpoint,) = root.glob("rlpd-*/checkpoints/final")
    assert load_checkpoint(rlpd_checkpoint).spec["algo"]["prior_data"] == str(dataset_file)

    write(pipeline_file, pipeline_document(rlpd_seed=1, rlpd_backend="inline"))
    assert cli.main(["pipeline", str(pipeline_file)]) == 0
    second = capsys.readouterr().out
    assert "stage ppo: reused" in second and "stage rollouts: reused" in second
    assert "stage rlpd: running" in second and len(list(root.glob("rlpd-*/checkpoints/final"))) == 2

    client = MlflowClient()
    parents = client.search_runs(
        [client.get_experiment_by_name("aa-ray").experiment_id], filter_string="tags.`aa_ray.kind` = 'pipeline'",
        order_by=["attributes.start_time ASC"],
    )
    assert len(parents) == 2
    first_children, second_children = (
        {run.data.tags["aa_ray.stage"]: run for run in children(client, p.info.run_id)} for p in parents
    )
    assert sorted(first_children) == sorted(second_children) == ["ppo", "rlpd", "rollouts"]
    for stage in ("ppo", "rollouts"):  # reused: the new child points at the run that made the output
        assert second_children[stage].data.tags["aa_ray.reused_from"] == first_children[stage].info.run_id
    assert "aa_ray.reused_from" not in second_children["rlpd"].data.tags
    assert first_children["rlpd"].data.metrics["replay/prior_size"] == 6 * 50
    assert first_children["rollouts"].data.metrics["rollout/transitions"] == 6 * 50
    # what fed what: the rollout run's dataset is the RLPD run's prior data (one name, one digest)
    (written,) = client.get_run(first_children["rollouts"].info.run_id).inputs.dataset_inputs
    (trained_on,) = client.get_run(first_children["rlpd"].info.run_id).inputs.dataset_inputs
    assert (written.dataset.name, written.dataset.digest) == (trained_on.dataset.name, trained_on.dataset.digest)
    assert [tag.value for tag in trained_on.tags] == ["training"] and written.dataset.name == "dataset.parquet"


@pytest.mark.usefixtures("one_ray")
def test_a_failing_stage_stops_the_pipeline_and_keeps_earlier_outputs(tmp_path: Path) -> None:
    pipeline_file = write(tmp_path / "pipeline.yaml", {"name": "broken", "stages": {
        "demos": {"kind": "rollout", "scripted": True, "spec": str(SPECS / "rlpd.yaml"), "episodes": 2},
        "train": {"kind": "train", "spec": str(SPECS / "rlpd.yaml"), "inputs": {"algo.prior_data": "demos.dataset"},
                  # in the trial's process: the env's error reaches the pipeline the same way, sooner
                  "set": {**TINY_SAC, "env.kwargs": {"no_such_argument": 1}, "runtime.backend": "inline"}},
    }})
    """The failed stage is named, the completed one keeps its output and is reused by the next
    invocation (which fails at the same stage again) while the output still has the hash recorded
    when the stage ended; a replaced output is named and its stage runs again; --force reruns it."""
    root = tmp_path / "runs" / "pipelines" / "broken"
    messages: list[str] = []
    for invocation in ("first", "reuse", "replaced", "force"):
        if invocation == "replaced":
            (dataset,) = root.glob("demos-*/dataset.parquet")
            shutil.copyfile(dataset, tmp_path / "kept.parquet")
            dataset.write_bytes(dataset.read_bytes() + b"\0")
        with pytest.raises(PipelineError, match="stage 'train' \\(train\\) failed: .*no_such_argument") as failure:
            run_pipeline(load_pipeline(pipeline_file), force=invocation == "force", track=False,
                         report=messages.append)
        assert "Completed stages keep their outputs" in str(failure.value)
    demos = [m.split(":")[1].split()[0] for m in messages if m.startswith("stage demos")]
    assert demos == ["running", "reused,", "not", "running", "running"]
    (changed,) = [m for m in messages if "not reused" in m]
    assert "dataset.parquet changed since the stage ended" in changed and ".changed-" in changed
    (aside,) = root.glob("demos-*.changed-*/dataset.parquet")  # kept as it was found, not deleted
    assert aside.read_bytes() == (tmp_path / "kept.parquet").read_bytes() + b"\0"
    assert len(list(root.glob("demos-*/dataset.parquet"))) == 2


@pytest.mark.parametrize(("document", "message"), [
    ({"search_space": {"algo.utd_ration": {"grid": [1, 2]}}}, "algo.utd_ration: unknown key"),
    ({"search_space": {"algo.utd_ratio": {"grid": [1, 0]}}}, "algo.utd_ratio = 0 does not make a valid spec"),
    ({"search_space": {"algo.tau": {"uniform": [0.1, 0.01]}}}, "uniform needs low < high"),
    ({"search_space": {"algo.tau": {"grid": [0.1]}}, "searcher": "optuna"}, "optuna cannot search grids"),
    ({"search_space": {"algo.tau": {"choice": [0.1]}}, "metric": "eval/retrun"}, "metric"),
    # pusher-reach's task metric is distance (eval/distance, train/distance); error is no metric of it
    ({"search_space": {"algo.tau": {"choice": [0.1]}}, "metric": "eval/error"},
     "metric 'eval/error' is not a metric the trials report; name one of eval/return, .*eval/distance, train/distance"),
    ({"search_space": {"algo.tau": {"choice": [0.1]}}, "samples": 3}, "samples: unknown key"),
])
def test_bad_sweep_files_are_rejected_before_anything_starts(tmp_path: Path, document: dict, message: str) -> None:
    sweep_file = write(tmp_path / "sweep.yaml", {"name": "bad", "base": str(SPECS / "sac.yaml"), **document})
    with pytest.raises(SpecError, match=message):
        load_sweep(sweep_file)


@pytest.mark.parametrize(("stages", "message"), [
    ({"a": {"kind": "rollout", "policy": "trainer.checkpoint", "episodes": 2}},
     "refers to stage 'trainer', which the pipeline does not have"),
    ({"a": {"kind": "train", "spec": "PPO", "inputs": {"algo.prior_data": "b.dataset"}},
      "b": {"kind": "rollout", "policy": "a.checkpoint", "episodes": 2}},
     "cycle \\(a -> b -> a\\)"),
    ({"a": {"kind": "train", "spec": "PPO"}, "b": {"kind": "rollout", "policy": "a.dataset", "episodes": 2}},
     "a train stage's output is a.checkpoint"),
    ({"a": {"kind": "train", "spec": "PPO", "set": {"algo.clip": 0.1}}}, "algo.clip: unknown key"),
    ({"a": {"kind": "rollout", "episodes": 2}}, "exactly one of policy"),
])
def test_bad_pipeline_files_are_rejected_before_anything_starts(tmp_path: Path, stages: dict, message: str) -> None:
    for stage in stages.values():
        if stage.get("spec") == "PPO":
            stage["spec"] = str(SPECS / "ppo.yaml")
    pipeline_file = write(tmp_path / "pipeline.yaml", {"name": "bad", "stages": stages})
    with pytest.raises(SpecError, match=message):
        load_pipeline(pipeline_file)
    assert cli.main(["pipeline", str(pipeline_file)]) == 2 and not (tmp_path / "runs").exists()


def test_store_writes_wait_out_a_locked_sqlite_store() -> None:
    """Concurrent trials share one SQLite store; a write that still finds it locked after SQLite's
    own busy wait is retried (other errors are not)."""
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return 42

    assert retry_locked(flaky) == 42 and len(calls) == 3
    with pytest.raises(ValueError, match="bad"):
        retry_locked(lambda: (_ for _ in ()).throw(ValueError("bad")))


SHIPPED = sorted((SPECS / "sweeps").glob("*.yaml")) + sorted((SPECS / "pipelines").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_sweep_and_pipeline_files_are_valid(path: Path) -> None:
    loaded = load_sweep(path) if path.parent.name == "sweeps" else load_pipeline(path)
    assert loaded.spec.name
