"""Minari in and out, and datasets in MLflow: a rollout written as Minari opens with
`minari.load_dataset` and holds the rollout's episodes (the same ones as its Parquet twin, actions in
the env's scale); RLPD reads it as prior data; a Minari dataset that does not fit the env, or holds a
bad value, is one message; a tracked rollout and a tracked RLPD run list the dataset under their
MLflow run's Datasets, with the same digest. Every dataset is made here, none downloaded.
(RLPD's learning threshold from a Minari dataset: tests/test_learning_rlpd.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
from learning_runs import SPECS
from minari.data_collector import EpisodeBuffer
from mlflow import MlflowClient

from aa_ray import cli
from aa_ray.data.dataset import DatasetError
from aa_ray.data.minari_format import MinariTransitions
from aa_ray.data.mlflow_inputs import mlflow_dataset
from aa_ray.data.sources import checked_prior_data, read_dataset
from aa_ray.envs import env_dims
from aa_ray.rollout.job import rollout
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

EPISODES = 6
DATASET_ID = "pusher/scripted-v0"
INLINE = ["runtime.backend=inline", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same scripted episodes written as Parquet and as Minari (same spec, same seeds)."""
    folder = tmp_path_factory.mktemp("rollouts")
    spec = load_spec(SPECS / "rlpd.yaml", INLINE)
    quiet = {"scripted": True, "report": lambda line: None}
    parquet = rollout(spec, folder / "scripted.parquet", EPISODES, **quiet)
    minari_summary = rollout(spec, folder / "minari", EPISODES, dataset_format="minari", dataset_id=DATASET_ID,
                             **quiet)
    return {"root": folder / "minari", "parquet": parquet, "minari": minari_summary}


def test_a_minari_rollout_opens_with_minari_and_holds_the_rollouts_episodes(
    rollouts: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary, twin = rollouts["minari"], rollouts["parquet"]
    assert summary["path"] == str(rollouts["root"] / DATASET_ID) and summary["dataset_id"] == DATASET_ID
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(rollouts["root"]))
    dataset = minari.load_dataset(DATASET_ID)
    assert dataset.total_episodes == summary["episodes"] == EPISODES
    assert dataset.total_steps == summary["transitions"] == twin["transitions"]
    returns = [float(np.sum(episode.rewards)) for episode in dataset]
    assert np.mean(returns) == pytest.approx(summary["mean_return"], abs=1e-5)
    # the env spec is recorded (gymnasium can make the env from it), spaces as the env's
    assert dataset.env_spec.id == "aa_ray/PusherReach-v0" and dataset.env_spec.max_episode_steps == 50
    env = dataset.recover_environment()
    assert env.action_space == dataset.action_space and env.observation_space.shape == dataset.observation_space.shape
    env.close()
    # Parquet twin: the same transitions; Minari keeps each episode's T + 1 observations and the
    # env-scale actions (pusher-reach's are [-1, 1] too), terminations and truncations apart
    rows = read_dataset(twin["path"]).read_all()
    for episode in dataset:
        mine = rows["eps_id"] == episode.id
        np.testing.assert_allclose(episode.observations[:-1], rows["obs"][mine], atol=1e-6)
        np.testing.assert_allclose(episode.observations[-1], rows["new_obs"][mine][-1], atol=1e-6)
        np.testing.assert_allclose(episode.actions, rows["actions"][mine], atol=1e-6)
        np.testing.assert_array_equal(episode.terminations, rows["terminateds"][mine])
        np.testing.assert_array_equal(episode.truncations, rows["truncateds"][mine])
    assert sum(int(e.truncations.sum()) for e in dataset) == EPISODES  # time limits, not terminal states
    # aa-ray's reader gives back the Parquet twin's transitions
    read = read_dataset(summary["path"])
    assert isinstance(read, MinariTransitions) and read.num_rows == twin["transitions"]
    read.check_values()
    for name, values in read.read_all().items():
        np.testing.assert_allclose(values, rows[name], atol=1e-6, err_msg=name)


def _minari_dataset(root: Path, dataset_id: str, action_space: gym.spaces.Box, edit=None) -> Path:
    """A small Minari dataset made with minari's own API, on pusher-reach's observation space."""
    env = gym.make("aa_ray/PusherReach-v0")
    rng = np.random.default_rng(0)
    steps = 5
    observations = rng.uniform(-0.1, 0.1, (steps + 1, env.observation_space.shape[0])).astype(np.float32)
    actions = rng.uniform(action_space.low, action_space.high, (steps, action_space.shape[0])).astype(np.float32)
    episode = {"observations": observations, "actions": actions, "rewards": np.zeros(steps),
               "terminations": np.zeros(steps, bool), "truncations": np.r_[np.zeros(steps - 1, bool), True]}
    if edit is not None:
        edit(episode)
    with pytest.MonkeyPatch.context() as patch, pytest.warns(UserWarning):  # minari: "author is None", ...
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        minari.create_dataset_from_buffers(
            dataset_id, [EpisodeBuffer(**episode)], env="aa_ray/PusherReach-v0", action_space=action_space,
            data_format="arrow",
        )
    env.close()
    return root / dataset_id


def _prior(value: str | Path):
    spec = load_spec(SPECS / "rlpd.yaml", [*INLINE, f"algo.prior_data={value}"])
    return checked_prior_data(spec, *env_dims(spec))


def test_a_minari_dataset_that_does_not_fit_the_env_is_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wide = _minari_dataset(tmp_path, "other/wide-v0", gym.spaces.Box(-2.0, 2.0, (2,), np.float32))
    with pytest.raises(DatasetError) as err:
        _prior(wide)
    message = str(err.value)
    assert "Minari dataset other/wide-v0" in message and str(wide) in message and "\n" not in message
    assert "its action space is Box[-2, 2] of shape (2,), the env's is Box[-1, 1] of shape (2,)" in message
    assert "observation space" not in message  # only what differs

    # the same through the command: one line, before anything starts
    code = cli.main(["run", str(SPECS / "rlpd.yaml"), "--plain", "--set", f"algo.prior_data={wide}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "does not fit env aa_ray/PusherReach-v0" in lines[0]

    # by id, under MINARI_DATASETS_PATH: found (and refused the same way), or not found, in one message
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    with pytest.raises(DatasetError, match=r"Minari dataset other/wide-v0 .*does not fit env"):
        _prior("other/wide-v0")
    with pytest.raises(DatasetError, match=r"'other/missing-v0' not found.*nor a Minari dataset id under"):
        _prior("other/missing-v0")


def test_a_minari_dataset_with_a_bad_value_is_named_like_parquet(tmp_path: Path) -> None:
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def nan_reward(episode: dict) -> None:
        episode["rewards"][3] = np.nan

    path = _minari_dataset(tmp_path, "bad/nan-v0", box, nan_reward)
    with pytest.raises(DatasetError, match=r"Minari dataset bad/nan-v0 .*episode 0, step 3: rewards holds NaN"):
        _prior(path)
    assert _prior(_minari_dataset(tmp_path, "good/fine-v0", box)) == (tmp_path / "good/fine-v0").resolve()


def test_rollout_and_rlpd_runs_list_the_dataset_in_mlflow(
    rollouts: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = MlflowClient()
    # a tracked rollout: the dataset it wrote is its run's input
    code = cli.main(["rollout", str(SPECS / "rlpd.yaml"), "--set", "runtime.backend=inline", "--scripted",
                     "--episodes", "2", "--format", "minari", "--out", str(tmp_path / "root"), "--track"])
    out = capsys.readouterr().out
    assert code == 0 and "minari.load_dataset('rlpd_pusher/scripted-v0')" in out, out
    (rollout_run,) = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    (written,) = rollout_run.inputs.dataset_inputs
    assert written.dataset.name == "rlpd_pusher/scripted-v0"
    assert {t.key: t.value for t in written.tags}["mlflow.data.context"] == "rollout output"

    # an RLPD run from that dataset, by id, lists it under Datasets: name, digest, source, schema; the
    # digest is the rollout run's, so the two runs show what fed what
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "root"))
    overrides = ["algo.prior_data=rlpd_pusher/scripted-v0", "runtime.backend=inline", "checkpoint.save_replay=false",
                 "checkpoint.every_env_steps=null", "budget.env_steps=300", "eval.every_env_steps=300",
                 "eval.episodes=1"]
    result = Trainer(load_spec(SPECS / "rlpd.yaml", overrides), live=False).run()
    (used,) = client.get_run(result.mlflow_run_id).inputs.dataset_inputs
    assert used.dataset.name == "rlpd_pusher/scripted-v0" and used.dataset.digest == written.dataset.digest
    assert json.loads(used.dataset.source) == {"uri": str((tmp_path / "root/rlpd_pusher/scripted-v0").resolve())}
    assert used.dataset.source_type == "local"
    columns = {column["name"]: column["tensor-spec"] for column in json.loads(used.dataset.schema)["mlflow_colspec"]}
    assert columns["observations"] == {"dtype": "float32", "shape": [-1, 10]} and "terminations" in columns
    assert {t.key: t.value for t in used.tags}["mlflow.data.context"] == "training"

    # a Parquet dataset as MLflow sees it: named by its file, digest of its bytes, RLlib's columns
    parquet = mlflow_dataset(rollouts["parquet"]["path"])
    assert parquet.name == "scripted.parquet" and parquet.digest != used.dataset.digest
    assert parquet.schema.input_names() == ["obs", "actions", "rewards", "new_obs", "terminateds", "truncateds",
                                            "eps_id", "t"]
    assert mlflow_dataset(rollouts["parquet"]["path"]).digest == parquet.digest  # stable


def test_a_pipeline_rollout_stage_writes_minari_when_asked(tmp_path: Path) -> None:
    """The stage's format option reaches its trial (the run itself: rollout and track_rollout above)."""
    from aa_ray.tune.pipeline import StagePlan
    from aa_ray.tune.specs import load_pipeline

    stages = {"demos": {"kind": "rollout", "scripted": True, "spec": str(SPECS / "rlpd.yaml"), "episodes": 2,
                        "format": "minari"},
              "rlpd": {"kind": "train", "spec": str(SPECS / "rlpd.yaml"),
                       "inputs": {"algo.prior_data": "demos.dataset"}}}
    (tmp_path / "pipeline.yaml").write_text(json.dumps({"name": "mini", "stages": stages}))
    pipeline = load_pipeline(tmp_path / "pipeline.yaml")
    plan = StagePlan(pipeline, "demos", {}, tmp_path / "runs")
    config = plan.trial_config(None)
    assert (config["format"], config["dataset_id"]) == ("minari", "mini/demos-v0")
    assert Path(config["out"]) / "mini/demos-v0" == plan.output == plan.folder / "minari" / "mini/demos-v0"

    stages["demos"]["dataset_id"] = "not an id"
    (tmp_path / "pipeline.yaml").write_text(json.dumps({"name": "mini", "stages": stages}))
    with pytest.raises(Exception, match="is not a Minari id"):
        load_pipeline(tmp_path / "pipeline.yaml")
