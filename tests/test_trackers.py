"""`tracking.backends`: one run recorded in MLflow, TensorBoard and Weights & Biases at once, each
read back with its own reader (MLflow's client, TensorBoard's event accumulator, the W&B offline
run's transaction log); a resume continuing the same run in all three; a sweep's trials grouped in
W&B and as TensorBoard subfolders; and a backend that is unknown or not installed refused as a spec
error. W&B runs offline here: nothing reaches the network."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import wandb
import yaml
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from aa_ray import metric_names as m
from aa_ray.errors import SpecError
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec
from aa_ray.tracking.mlflow_tracker import PARENT_TAG
from aa_ray.tracking.trackers import open_trackers
from aa_ray.tracking.wandb_tracker import WandbError
from aa_ray.tune.parent import ParentRun, trial_tracking
from aa_ray.tune.specs import load_sweep
from aa_ray.tune.sweep import run_sweep
from aa_ray.tune.trials import run_context

ROOT = Path(__file__).resolve().parents[1]
PENDULUM = ROOT / "specs" / "sac_pendulum.yaml"
ALL_BACKENDS = "tracking.backends=[mlflow,tensorboard,wandb]"
TINY = [
    "budget.env_steps=600", "algo.warm_up_steps=200", "algo.train_every=8", "algo.batch_size=32",
    "algo.actor_hidden_dims=[16,16]", "algo.critic_hidden_dims=[16,16]", "runners.num_runners=1",
    "eval.every_env_steps=300", "eval.episodes=1", "checkpoint.every_env_steps=100000",
    "runtime.backend=inline", "tracking.log_model=false", ALL_BACKENDS,
]


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B records locally, and keeps its settings and caches out of the home folder. W&B reads the
    environment once per process (its setup, kept until `wandb.teardown`): each test starts afresh."""
    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    wandb.teardown()


def wandb_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """The records of a W&B run's `.wandb` transaction log: a 7-byte header (":W&B", a magic
    number, a version), then LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte
    header (CRC, little-endian length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, chunks, position = [], [], 7
    while position + 7 <= len(data):
        left_in_block = block - position % block
        if left_in_block < 7:  # a block's tail too short for a header is padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:  # zero-filled rest of a block
            position += left_in_block
            continue
        chunks.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def wandb_run(run_dir: Path, run_id: str) -> list[dict]:
    """Every offline W&B run folder of `run_id` under the run folder (one per attempt), oldest first,
    each as {"run": its run record, "history": [{metric: value, "_step": step}, ...]}."""
    attempts = []
    for folder in sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}")):
        records = wandb_records(folder / f"run-{run_id}.wandb")
        history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                   for r in records if r.WhichOneof("record_type") == "history"]
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        attempts.append({"run": run, "history": history})
    return attempts


def tensorboard_scalars(folder: Path, tag: str) -> dict[int, float]:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: every point, not a sample
    events.Reload()
    return {event.step: event.value for event in events.Scalars(tag)}


def mlflow_history(run_id: str, metric: str) -> dict[int, float]:
    return {point.step: point.value for point in MlflowClient().get_metric_history(run_id, metric)}


def test_a_run_writes_the_same_metrics_to_all_three_and_a_resume_continues_each(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = Trainer(load_spec(PENDULUM, TINY), run_dir=run_dir, live=False).run()
    runs = first.tracking_runs
    assert set(runs) == {"mlflow", "tensorboard", "wandb"} and runs["mlflow"] == first.mlflow_run_id
    assert Path(runs["tensorboard"]) == run_dir.resolve()

    for metric in (m.EVAL_RETURN, "env/steps"):
        in_mlflow = mlflow_history(runs["mlflow"], metric)
        assert in_mlflow, f"MLflow has no {metric}"
        assert tensorboard_scalars(run_dir, metric) == pytest.approx(in_mlflow, rel=1e-6)  # event files: float32
        (attempt,) = wandb_run(run_dir, runs["wandb"])
        in_wandb = {row["_step"]: row[metric] for row in attempt["history"] if metric in row}
        assert in_wandb == pytest.approx(in_mlflow)
    assert attempt["run"].project == "aa-ray" and attempt["run"].run_group == ""  # a lone run: no group

    # the resume: a larger budget from the final checkpoint, into the same run of every backend
    resumed = Trainer(load_spec(PENDULUM, [*TINY, "budget.env_steps=900"]),
                      resume=load_checkpoint(Path(first.checkpoint)), live=False).run()
    assert resumed.tracking_runs == runs
    assert Path(resumed.run_dir) == run_dir
    after = {step for step in mlflow_history(runs["mlflow"], "env/steps") if step > first.env_steps}
    assert after, "the resumed run logged nothing past the checkpoint"
    assert after <= set(tensorboard_scalars(run_dir, "env/steps"))  # appended in the same folder
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2
    attempts = wandb_run(run_dir, runs["wandb"])  # W&B offline: a folder per attempt, one run id
    assert len(attempts) == 2
    assert after <= {row["_step"] for row in attempts[1]["history"] if "env/steps" in row}


def test_a_sweeps_trials_are_a_wandb_group_and_tensorboard_subfolders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    """What a sweep hands its trials (`trial_tracking`, `run_context`) opens each trial's run
    nested under the MLflow parent, in the W&B group named after the sweep's folder, and with its
    event files in its own run folder inside the sweep's folder. The W&B key is in none of it."""
    api_key = "fake-wandb-key-0123456789abcdef0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", api_key)
    spec = load_spec(PENDULUM, TINY)
    parent = ParentRun(spec.tracking.experiment, "sweep", "lr", run_name="sweep:lr")
    root = tmp_path / "runs" / "sweep-lr-20260101-000000"
    tracking = trial_tracking(parent, "sweep", "lr", root.name, "lr", {})
    trial_runs = {}
    for trial_id in ("trial_a", "trial_b"):
        trackers = open_trackers(spec, root / trial_id, context=run_context({"tracking": tracking}, trial_id))
        trackers.log_metrics({"eval/return": -100.0}, step=300)
        trackers.finish("FINISHED", say=lambda _: None)
        trial_runs[trial_id] = trackers.run_ids
    parent.finish("FINISHED")

    children = {run.info.run_id for run in parent.children()}
    assert children == {runs["mlflow"] for runs in trial_runs.values()}
    for trial_id, runs in trial_runs.items():
        (attempt,) = wandb_run(root / trial_id, runs["wandb"])
        assert attempt["run"].run_group == root.name
        assert tensorboard_scalars(root / trial_id, "eval/return") == {300: -100.0}
    # `tensorboard --logdir runs/` lists each trial as sweep-lr-.../trial_a, sweep-lr-.../trial_b
    folders = {path.parent.relative_to(tmp_path / "runs") for path in root.rglob("events.out.tfevents.*")}
    assert folders == {Path(root.name) / "trial_a", Path(root.name) / "trial_b"}
    child = MlflowClient().get_run(trial_runs["trial_a"]["mlflow"])
    assert child.data.tags[PARENT_TAG] == parent.run_id
    shown = capfd.readouterr()
    assert api_key not in shown.out + shown.err
    assert not [path for path in root.rglob("*") if path.is_file() and api_key.encode() in path.read_bytes()]


@pytest.mark.fresh_store  # it checks that no MLflow store is made
def test_a_sweep_tracked_in_tensorboard_and_wandb_only(tmp_path: Path) -> None:
    """A real sweep (Tune, two trials, inline actors) with no MLflow backend: no parent run and no
    MLflow store; each trial's event files in its run folder inside the sweep's folder, and its W&B
    run in the group named after that folder."""
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "seeds", "base": str(PENDULUM),
        "set": {**{key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in TINY)},
                "budget.env_steps": 400, "tracking.backends": ["tensorboard", "wandb"]},
        "search_space": {"seed": {"grid": [1, 2]}}, "metric": "eval/return", "mode": "max",
        "max_concurrent_trials": 2,
    }))
    outcome = run_sweep(load_sweep(sweep_file), report=lambda _: None)
    assert outcome["parent_run_id"] is None and not (tmp_path / "mlflow.db").exists()
    root = Path(outcome["root"])
    for trial in outcome["trials"]:
        folder = root / trial["trial_id"]
        assert tensorboard_scalars(folder, "eval/return"), f"no event files in {folder}"
        (run_id,) = {path.name.rsplit("-", 1)[1] for path in (folder / "wandb").glob("offline-run-*")}
        (attempt,) = wandb_run(folder, run_id)
        assert attempt["run"].run_group == root.name
        assert any("eval/return" in row for row in attempt["history"])


@pytest.mark.fresh_store  # it checks that no MLflow store is made
def test_without_mlflow_a_trial_needs_no_parent_run(tmp_path: Path) -> None:
    spec = load_spec(PENDULUM, [*TINY, "tracking.backends=[tensorboard]"])
    tracking = trial_tracking(None, "sweep", "lr", "sweep-lr-1", "lr", {})
    context = run_context({"tracking": tracking}, "trial_a")
    assert context.parent_run_id is None and context.group == "sweep-lr-1"
    trackers = open_trackers(spec, tmp_path / "trial_a", context=context)
    assert trackers.mlflow is None and set(trackers.run_ids) == {"tensorboard"}
    trackers.log_metrics({"eval/return": 1.0}, step=1)
    trackers.finish("FINISHED")
    assert tensorboard_scalars(tmp_path / "trial_a", "eval/return") == {1: 1.0}
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow store touched


def test_a_wandb_server_that_does_not_answer_is_one_paragraph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online, against a local port nothing listens on (no network needed): W&B's own error becomes
    one paragraph saying what to do, without the API key, and the backend opened before it is closed."""
    api_key = "fake-wandb-key-fedcba9876543210fedcba9876543210"
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: refused at once
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    monkeypatch.setenv("WANDB_API_KEY", api_key)
    spec = load_spec(PENDULUM, [*TINY, "tracking.backends=[tensorboard,wandb]"])
    with pytest.raises(WandbError) as raised:
        open_trackers(spec, tmp_path / "run")
    message = str(raised.value)
    assert "tracking.backends: wandb could not start the run" in message and "wandb login" in message
    assert "WANDB_MODE=offline" in message and api_key not in message and "\n" not in message
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert "status/text_summary" in events.Tags()["tensors"]  # the TensorBoard run opened first was ended


def test_an_unknown_backend_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"tracking\.backends.*'mlflow', 'tensorboard' or 'wandb'"):
        load_spec(PENDULUM, ["tracking.backends=[mlflow,comet]"])
    with pytest.raises(SpecError, match="mlflow named more than once"):
        load_spec(PENDULUM, ["tracking.backends=[mlflow,mlflow]"])


@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_a_backend_whose_package_is_missing_is_a_spec_error(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # what Python does for a package that cannot be imported
    with pytest.raises(SpecError, match=rf"tracking\.backends: {backend} needs the {backend} package.*"
                                        rf"pip install 'aa-ray\[{backend}\]'"):
        load_spec(PENDULUM, [f"tracking.backends=[mlflow,{backend}]"])
    load_spec(PENDULUM, [f"tracking.backends=[mlflow,{backend}]", "tracking.enabled=false"])  # an untracked run
