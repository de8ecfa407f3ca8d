"""Transition datasets: the Parquet format and its validation, RLPD's prior/online batch layout,
the checks that stop a run before Ray starts, and `aa-ray rollout` on the env-runner fleet."""

from __future__ import annotations

import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import ray
import torch

from aa_ray import cli
from aa_ray.data import dataset as ds
from aa_ray.data.dataset import DatasetError, DatasetMeta, write_dataset
from aa_ray.data.sources import read_dataset
from aa_ray.records import CheckpointParts, Transitions
from aa_ray.rollout.job import RolloutError, check_scripted, policy_from_checkpoint, rollout
from aa_ray.rollout.recorder import DatasetRecorder
from aa_ray.runtime.checkpoint import save_checkpoint
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.replay import ReplayBuffer, prior_rows
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import apply_overrides, load_spec, validate_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
PUSHER = "aa_ray/PusherReach-v0"


def pusher_meta(producer: str = "scripted", obs_dim: int = 10, act_dim: int = 2) -> DatasetMeta:
    obs_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
    return DatasetMeta.for_env(PUSHER, obs_space, act_space, producer)


def fake_transitions(n: int, obs_dim: int = 10, act_dim: int = 2, episode_length: int = 5, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = np.arange(n) % episode_length
    return {
        ds.OBS: rng.normal(size=(n, obs_dim)).astype(np.float32),
        ds.ACTIONS: rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
        ds.REWARDS: rng.normal(size=n).astype(np.float32),
        ds.NEXT_OBS: rng.normal(size=(n, obs_dim)).astype(np.float32),
        ds.TERMINATEDS: rng.random(n) < 0.1,
        ds.TRUNCATEDS: t == episode_length - 1,
        ds.EPS_ID: np.arange(n) // episode_length,
        ds.T: t,
    }


def test_columns_are_rllibs_offline_columns() -> None:
    """Every column we write is one RLlib's offline reader maps by default (nothing lands in its
    catch-all extra_model_outputs), under the names of ray.rllib.core.columns.Columns."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.offline.offline_prelearner import SCHEMA

    assert (ds.OBS, ds.ACTIONS, ds.REWARDS, ds.NEXT_OBS) == (
        Columns.OBS,
        Columns.ACTIONS,
        Columns.REWARDS,
        Columns.NEXT_OBS,
    )
    assert (ds.TERMINATEDS, ds.TRUNCATEDS, ds.EPS_ID, ds.T) == (
        Columns.TERMINATEDS,
        Columns.TRUNCATEDS,
        Columns.EPS_ID,
        Columns.T,
    )
    assert set(ds.COLUMNS) <= set(SCHEMA.values())


def test_write_read_round_trip_gives_identical_arrays(tmp_path: Path) -> None:
    transitions = fake_transitions(1000)
    path = write_dataset(tmp_path / "d.parquet", transitions, pusher_meta("runs/x/checkpoints/final"))
    assert not (tmp_path / "d.parquet.tmp").exists()

    dataset = read_dataset(path, expect_env_id=PUSHER, expect_obs_dim=10, expect_act_dim=2)
    back = dataset.read_all()
    assert set(back) == set(ds.COLUMNS)
    for name, values in transitions.items():
        assert back[name].dtype == np.asarray(values).dtype, name
        np.testing.assert_array_equal(back[name], values, err_msg=name)

    # streamed in bounded batches (never one whole-file load), the same rows in the same order
    chunks = list(dataset.iter_batches(batch_rows=300))
    assert len(chunks) >= 4 and max(len(c[ds.REWARDS]) for c in chunks) <= 300
    np.testing.assert_array_equal(np.concatenate([c[ds.OBS] for c in chunks]), transitions[ds.OBS])

    meta = dataset.meta
    assert dataset.num_rows == 1000 and meta.num_transitions == 1000 and meta.num_episodes == 200
    assert meta.env_id == PUSHER and meta.producer == "runs/x/checkpoints/final"
    assert meta.observation_space.shape == (10,) and meta.observation_space.low[0] == -np.inf
    assert meta.action_space.low == (-1.0, -1.0) and meta.action_space.high == (1.0, 1.0)
    assert meta.format_version == ds.FORMAT_VERSION and meta.created
    # the metadata is plain JSON in the file, readable without aa-ray
    raw = pq.ParquetFile(path).metadata.metadata[b"aa_ray.dataset"]
    assert b'"env_id": "aa_ray/PusherReach-v0"' in raw and b'"action_encoding"' in raw


def test_a_folder_of_files_is_one_dataset(tmp_path: Path) -> None:
    write_dataset(tmp_path / "d" / "part-0.parquet", fake_transitions(20, seed=1), pusher_meta())
    write_dataset(tmp_path / "d" / "part-1.parquet", fake_transitions(30, seed=2), pusher_meta())
    dataset = read_dataset(tmp_path / "d", expect_env_id=PUSHER)
    assert dataset.num_rows == 50 and len(dataset.read_all()[ds.REWARDS]) == 50


@pytest.mark.fresh_store  # it checks that its folder is left empty
def test_writer_refuses_arrays_that_do_not_match_the_metadata(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"column obs: expected shape \(10, 10\), got \(10, 9\)"):
        write_dataset(tmp_path / "d.parquet", fake_transitions(10, obs_dim=9), pusher_meta())
    assert not list(tmp_path.iterdir())  # nothing half-written is left


@pytest.fixture
def good_dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "good.parquet", fake_transitions(50), pusher_meta())


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        (
            {"expect_env_id": "Pendulum-v1"},
            "was recorded on env 'aa_ray/PusherReach-v0', but this run's env is 'Pendulum-v1'",
        ),
        ({"expect_obs_dim": 3}, "holds observations of dim 10, but this run's env has obs_dim 3"),
        ({"expect_act_dim": 1}, "holds actions of dim 2, but this run's env has act_dim 1"),
    ],
)
def test_wrong_env_or_dims_are_rejected_naming_file_and_mismatch(
    good_dataset: Path, expect: dict, message: str
) -> None:
    with pytest.raises(DatasetError) as err:
        read_dataset(good_dataset, **expect)
    assert str(good_dataset) in str(err.value) and message in str(err.value)


def test_files_that_are_not_datasets_are_rejected(tmp_path: Path, good_dataset: Path) -> None:
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet at all")
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), plain)
    partial = tmp_path / "partial.parquet"
    table = pq.read_table(good_dataset)
    pq.write_table(table.drop_columns(["new_obs"]), partial)
    cases = [
        (text, "is not a Parquet file"),
        (plain, "is a Parquet file but not an aa-ray transition dataset"),
        (partial, "lacks the columns ['new_obs']"),
        (tmp_path / "missing.parquet", "not found"),
    ]
    for path, message in cases:
        with pytest.raises(DatasetError) as err:
            read_dataset(path)
        assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    assert issubclass(DatasetError, ValueError)


# ---- RLPD: the replay's prior buffer ------------------------------------------------------------


def online_chunk(n: int, obs_dim: int = 10) -> Transitions:
    return Transitions(
        obs=np.full((n, obs_dim), 7.0, np.float32),
        action=np.zeros((n, 2), np.float32),
        reward=np.ones(n, np.float32),  # online rows: reward +1 ...
        next_obs=np.zeros((n, obs_dim), np.float32),
        terminated=np.zeros(n, np.float32),
        truncated=np.zeros(n, np.float32),
        discount=np.full(n, 0.9**3, np.float32),  # ... and a 3-step discount
    )


@pytest.mark.parametrize(("ratio", "batch_size", "expected"), [(0.5, 8, 4), (0.25, 8, 2), (0.5, 256, 128), (0.0, 8, 0)])
def test_rlpd_batches_are_prior_rows_then_online_rows_exactly_at_ratio(
    tmp_path: Path, ratio: float, batch_size: int, expected: int
) -> None:
    prior = fake_transitions(40)
    prior[ds.REWARDS] = -np.ones(40, np.float32)  # prior rows: reward -1
    path = write_dataset(tmp_path / "prior.parquet", prior, pusher_meta())
    replay = ReplayBuffer(capacity=100, obs_dim=10, act_dim=2, seed=0)
    info = replay.load_prior(path, ratio=ratio, gamma=0.9, env_id=PUSHER)
    assert info.rows == 40
    np.testing.assert_allclose(info.obs[1], prior[ds.OBS].mean(0), rtol=1e-5)
    replay.add(online_chunk(30))

    assert prior_rows(batch_size, ratio) == expected
    batch = replay.sample(num_batches=5, batch_size=batch_size)
    assert batch.obs.shape == (5, batch_size, 10)
    assert np.all(batch.reward[:, :expected] == -1.0) and np.all(batch.reward[:, expected:] == 1.0)
    # prior rows are 1-step transitions (discount gamma); online rows keep their own discount
    assert np.all(batch.discount[:, :expected] == np.float32(0.9))
    assert np.all(batch.discount[:, expected:] == np.float32(0.9**3))
    # and their fields stay aligned row by row with the dataset
    rows = batch.obs[:, :expected].reshape(-1, 10)
    matches = (rows[:, None, :] == prior[ds.OBS][None]).all(-1)
    assert np.all(matches.sum(1) == 1)
    if expected:
        index = matches.argmax(1)
        np.testing.assert_array_equal(batch.action[:, :expected].reshape(-1, 2), prior[ds.ACTIONS][index])
        np.testing.assert_array_equal(batch.terminated[:, :expected].reshape(-1), prior[ds.TERMINATEDS][index])


def test_replay_refuses_a_prior_dataset_for_other_dims(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "p.parquet", fake_transitions(10), pusher_meta())
    with pytest.raises(DatasetError, match="this run's env has obs_dim 3"):
        ReplayBuffer(capacity=10, obs_dim=3, act_dim=2, seed=0).load_prior(path, 0.5, 0.99, PUSHER)


# ---- stopping before anything starts ------------------------------------------------------------


def rlpd_overrides(prior: Path, *extra: str) -> list[str]:
    return [f"algo.prior_data={prior}", "tracking.enabled=false", *extra]


def test_run_with_a_mismatched_dataset_fails_before_ray_starts(tmp_path: Path, capsys) -> None:
    pendulum = DatasetMeta.for_env(
        "Pendulum-v1", gym.spaces.Box(-8, 8, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32), "scripted"
    )
    wrong = write_dataset(tmp_path / "pendulum.parquet", fake_transitions(10, obs_dim=3, act_dim=1), pendulum)
    assert not ray.is_initialized()

    spec = load_spec(SPECS / "rlpd.yaml", rlpd_overrides(wrong))
    with pytest.raises(DatasetError, match="algo.prior_data: dataset .*pendulum.parquet was recorded on env"):
        Trainer(spec, live=False).run()
    assert not ray.is_initialized()

    code = cli.main(["run", str(SPECS / "rlpd.yaml"), "--plain", "--set", f"algo.prior_data={wrong}"])
    err = capsys.readouterr().err
    assert code == 2 and not ray.is_initialized()
    assert "aa-ray: error: algo.prior_data: dataset" in err and "pendulum.parquet" in err
    assert "'Pendulum-v1', but this run's env is 'aa_ray/PusherReach-v0'" in err and "Traceback" not in err

    code = cli.main(["run", str(SPECS / "rlpd.yaml"), "--plain", "--set", f"algo.prior_data={tmp_path / 'nope'}"])
    assert code == 2 and "not found" in capsys.readouterr().err and not ray.is_initialized()


def test_validate_reports_the_prior_dataset(tmp_path: Path, capsys, good_dataset: Path) -> None:
    # the shipped spec validates before its dataset exists (CI has none) ...
    assert cli.main(["validate", str(SPECS / "rlpd.yaml")]) == 0
    assert "does not exist yet" in capsys.readouterr().out
    # ... and a dataset that exists is checked against the env
    assert cli.main(["validate", str(SPECS / "rlpd.yaml"), "--set", f"algo.prior_data={good_dataset}"]) == 0
    assert "50 transitions from scripted" in capsys.readouterr().out
    args = [
        "validate",
        str(SPECS / "rlpd.yaml"),
        "--set",
        "env.id=Pendulum-v1",
        "--set",
        f"algo.prior_data={good_dataset}",
    ]
    assert cli.main(args) == 2
    assert "was recorded on env 'aa_ray/PusherReach-v0'" in capsys.readouterr().err


def test_rollout_errors_are_explained_before_ray_starts(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "d.parquet")
    code = cli.main(
        [
            "rollout",
            str(SPECS / "rlpd.yaml"),
            "--episodes",
            "2",
            "--out",
            out,
            "--checkpoint",
            str(tmp_path / "no_such_checkpoint"),
        ]
    )
    assert code == 2 and "no_such_checkpoint' not found" in capsys.readouterr().err
    code = cli.main(["rollout", str(SPECS / "sac_pendulum.yaml"), "--episodes", "2", "--out", out, "--scripted"])
    err = capsys.readouterr().err
    assert code == 2 and "env 'Pendulum-v1' has no scripted controller" in err and "--checkpoint" in err
    # a checkpoint trained on another env
    pendulum = load_spec(SPECS / "sac_pendulum.yaml")
    save_checkpoint(tmp_path / "ckpt", pendulum, CheckpointParts(learner=Learner(pendulum, 3, 1).state_dict()))
    code = cli.main(
        ["rollout", str(SPECS / "rlpd.yaml"), "--episodes", "2", "--out", out, "--checkpoint", str(tmp_path / "ckpt")]
    )
    assert code == 2 and "was trained on env 'Pendulum-v1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: --episodes must be positive, one source is required
        cli.main(["rollout", str(SPECS / "rlpd.yaml"), "--episodes", "0", "--out", out, "--scripted"])
    with pytest.raises(SystemExit):
        cli.main(["rollout", str(SPECS / "rlpd.yaml"), "--episodes", "2", "--out", out])
    assert not ray.is_initialized() and not Path(out).exists()


def test_a_checkpoint_whose_algo_does_not_fit_the_rollout_spec_is_refused(tmp_path: Path, capsys) -> None:
    """The spec to roll out with takes the checkpoint's algo and is validated whole: a PPO policy
    cannot be rolled out with an async-mode spec (async needs an off-policy algorithm)."""
    ppo = load_spec(SPECS / "ppo.yaml")
    save_checkpoint(tmp_path / "ckpt", ppo, CheckpointParts(learner=Learner(ppo, 10, 2).state_dict()))
    out = tmp_path / "d.parquet"
    code = cli.main(["rollout", str(SPECS / "sac.yaml"), "--set", "runtime.mode=async", "--episodes", "2",
                     "--out", str(out), "--checkpoint", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert code == 2 and "with the algo of checkpoint" in err and "runtime.mode async needs an off-policy" in err
    assert not ray.is_initialized() and not out.exists()
    rolled, _ = policy_from_checkpoint(load_spec(SPECS / "sac.yaml"), tmp_path / "ckpt")  # sync: it fits
    assert rolled.algo.name == "ppo" and rolled.algo.family == "on_policy"


# ---- DatasetRecorder.rollout, in-process -----------------------------------------------------------


class CountingEnv(gym.Env):
    """obs = [steps taken in this episode]; time limit 4 steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), False, False, {}


gym.register("aa_ray_tests/DatasetCounting-v0", entry_point=CountingEnv, max_episode_steps=4)


def test_recorder_returns_whole_numbered_episodes_and_carries_the_rest_over() -> None:
    raw = {
        "name": "counting",
        "env": {"id": "aa_ray_tests/DatasetCounting-v0"},
        "algo": {"name": "sac", "warm_up_steps": 10, "batch_size": 8, "buffer_size": 100, "actor_hidden_dims": [8],
        "critic_hidden_dims": [8]},
        "budget": {"env_steps": 1000},
        "runners": {"envs_per_runner": 2},
    }
    runner = DatasetRecorder(validate_spec(apply_overrides(raw, [])), index=0)
    first, stats = runner.rollout(3, first_eps_id=10)
    assert set(first) == set(ds.COLUMNS) and len(stats) == 3
    assert first[ds.EPS_ID].tolist() == [10] * 4 + [11] * 4 + [12] * 4
    assert first[ds.T].tolist() == [0, 1, 2, 3] * 3
    assert first[ds.OBS][:, 0].tolist() == [0, 1, 2, 3] * 3  # never an autoreset step
    assert first[ds.NEXT_OBS][:, 0].tolist() == [1, 2, 3, 4] * 3
    assert first[ds.TRUNCATEDS].tolist() == [False, False, False, True] * 3 and not first[ds.TERMINATEDS].any()
    assert first[ds.ACTIONS].min() >= -1 and first[ds.ACTIONS].max() <= 1  # policy space, not the env's +-2
    assert [s.episode_return for s in stats] == [10.0] * 3
    # the 4th episode (finished alongside the 3rd) was kept for the next call
    second, _ = runner.rollout(2, first_eps_id=13)
    assert second[ds.EPS_ID].tolist() == [13] * 4 + [14] * 4 and second[ds.T].tolist() == [0, 1, 2, 3] * 2


# ---- scripted controllers: declared by the env, in its metadata ---------------------------------------


def half_throttle(obs: np.ndarray) -> np.ndarray:
    return np.full((len(obs), 1), 0.5)


class ControlledCountingEnv(CountingEnv):
    metadata = {"scripted_controller": f"{__name__}:half_throttle"}  # as an import path, like pusher-reach's


class CallableControllerEnv(CountingEnv):
    metadata = {"scripted_controller": lambda obs: np.full((len(obs), 1), -3.0)}  # the function itself


def counting_spec(entry_point: type[gym.Env], *overrides: str) -> ExperimentSpec:
    raw = {"name": "counting", "env": {"id": "counting", "entry_point": entry_point, "max_episode_steps": 4},
           "algo": {"name": "sac", "warm_up_steps": 10, "actor_hidden_dims": [8], "critic_hidden_dims": [8]},
           "budget": {"env_steps": 1000}, "runners": {"envs_per_runner": 2}}
    return validate_spec(apply_overrides(raw, list(overrides)))


def test_an_env_declares_its_own_scripted_controller(tmp_path: Path) -> None:
    """A user's env ships its controller in metadata["scripted_controller"], by import path or as the
    function itself; actions are clipped to [-1, 1] and recorded in the policy's space."""
    spec = counting_spec(ControlledCountingEnv)
    check_scripted(spec)
    columns, stats = DatasetRecorder(spec, index=0).rollout(2, first_eps_id=0, scripted=True)
    assert len(stats) == 2 and (columns[ds.ACTIONS] == 0.5).all()
    columns, _ = DatasetRecorder(counting_spec(CallableControllerEnv), index=0).rollout(1, 0, scripted=True)
    assert (columns[ds.ACTIONS] == -1.0).all()
    inline = counting_spec(ControlledCountingEnv, "runtime.backend=inline")
    summary = rollout(inline, tmp_path / "scripted.parquet", 3, scripted=True, report=lambda line: None)
    assert summary["producer"] == "scripted" and summary["episodes"] == 3 and not ray.is_initialized()


class NoSuchModuleControllerEnv(CountingEnv):
    metadata = {"scripted_controller": "no_such_controllers:reach"}


class NotAFunctionControllerEnv(CountingEnv):
    metadata = {"scripted_controller": 3}


class WrongShapeControllerEnv(CountingEnv):
    metadata = {"scripted_controller": lambda obs: np.zeros((len(obs), 2))}


@pytest.mark.parametrize(("env_class", "says"), [
    (CountingEnv, "env 'counting' has no scripted controller (an env declares one in its "
                  "metadata['scripted_controller']"),
    (NoSuchModuleControllerEnv, "NoSuchModuleControllerEnv.metadata['scripted_controller']: importing "
                                "'no_such_controllers'"),
    (NotAFunctionControllerEnv, "NotAFunctionControllerEnv.metadata['scripted_controller'] must be a function"),
])
def test_a_missing_or_wrong_controller_declaration_is_refused_before_a_rollout_starts(
    env_class: type[gym.Env], says: str
) -> None:
    with pytest.raises(RolloutError) as refused:
        check_scripted(counting_spec(env_class))
    assert says in str(refused.value)


def test_a_controller_that_returns_the_wrong_shape_is_named() -> None:
    recorder = DatasetRecorder(counting_spec(WrongShapeControllerEnv), index=0)
    with pytest.raises(ValueError, match=r"scripted controller .*<lambda> returned actions of shape \(2, 2\)"):
        recorder.rollout(1, 0, scripted=True)


# ---- on a real local Ray ------------------------------------------------------------------------


@pytest.fixture(scope="class")
def local_ray():
    """One small Ray for the class: `aa-ray rollout` and the trainer join it instead of starting their own."""
    ray.init(address="local", num_cpus=4,  # never a cluster another test started on this host
             include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_a_checkpoint_rolls_out_inline_with_no_ray_started(tmp_path: Path) -> None:
    """`runtime.backend: inline`: the rollout's runners are plain objects in this process (an actor
    graph without learners), acting deterministically with the checkpoint's weights."""
    spec = load_spec(SPECS / "rlpd.yaml", ["runtime.backend=inline", "runners.num_runners=2"])
    learner = Learner(spec, 10, 2)
    save_checkpoint(tmp_path / "ckpt", spec, CheckpointParts(learner=learner.state_dict()))
    summary = rollout(spec, tmp_path / "inline.parquet", 3, checkpoint=tmp_path / "ckpt", deterministic=True,
                      report=lambda line: None)
    assert not ray.is_initialized()
    arrays = read_dataset(tmp_path / "inline.parquet", expect_env_id=PUSHER).read_all()
    assert summary["episodes"] == 3 and sorted(set(arrays[ds.EPS_ID].tolist())) == [0, 1, 2]
    with torch.no_grad():
        expected = learner.algo.policy.act(arrays[ds.OBS], deterministic=True)
    np.testing.assert_allclose(arrays[ds.ACTIONS], expected, atol=1e-6)

    # the same path again: a dataset is not replaced without a word
    with pytest.raises(RolloutError, match="already exists.*--overwrite"):
        rollout(spec, tmp_path / "inline.parquet", 1, checkpoint=tmp_path / "ckpt", report=lambda line: None)
    assert read_dataset(tmp_path / "inline.parquet").num_rows == len(arrays[ds.EPS_ID])
    again = rollout(spec, tmp_path / "inline.parquet", 1, checkpoint=tmp_path / "ckpt", report=lambda line: None,
                    overwrite=True)
    assert again["episodes"] == 1 and read_dataset(tmp_path / "inline.parquet").num_rows == again["transitions"]


@pytest.mark.usefixtures("local_ray")
class TestOnRay:
    def test_scripted_rollout_writes_a_dataset_that_pyarrow_ray_data_and_rllib_read(
        self, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        out = tmp_path / "scripted.parquet"
        code = cli.main(
            [
                "rollout",
                str(SPECS / "rlpd.yaml"),
                "--scripted",
                "--episodes",
                "6",
                "--out",
                str(out),
                "--set",
                "runners.num_runners=2",
            ]
        )
        assert code == 0

        table = pads.dataset(out, format="parquet").to_table()
        assert table.num_rows == 6 * 50 and sorted(set(table.column("eps_id").to_pylist())) == list(range(6))
        data = read_dataset(out, expect_env_id=PUSHER, expect_obs_dim=10, expect_act_dim=2)
        assert data.meta.producer == "scripted" and data.meta.num_episodes == 6
        arrays = data.read_all()
        ends = arrays[ds.TRUNCATEDS]
        assert ends.sum() == 6 and np.all(arrays[ds.T][ends] == 49)
        final_distance = np.linalg.norm(arrays[ds.NEXT_OBS][ends][:, 8:10], axis=1)  # obs[8:10] = tip - target
        assert final_distance.max() < 1e-3
        # the summary has the mean of each task metric at the episodes' ends: is_success, pusher-reach's distance
        summary = capsys.readouterr().out
        assert "mean success 1," in summary and "mean distance " in summary, summary

        # Ray Data reads the file as it is, and RLlib's offline reader maps every column it holds
        rows = ray.data.read_parquet(str(out)).take_batch(4, batch_format="numpy")
        assert np.stack(rows["obs"]).shape == (4, 10) and rows["rewards"].dtype == np.float32
        from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
        from ray.rllib.offline.offline_prelearner import OfflinePreLearner

        if not hasattr(OfflinePreLearner, "_map_to_episodes"):
            pytest.skip("this Ray's OfflinePreLearner has no _map_to_episodes")
        config = AlgorithmConfig().offline_data(input_=[str(out)])
        episodes = OfflinePreLearner._map_to_episodes(types.SimpleNamespace(config=config), rows)["episodes"]
        np.testing.assert_array_equal(episodes[0].get_actions()[0], rows["actions"][0])
        assert episodes[0].extra_model_outputs == {}  # no column of ours is unknown to RLlib

    def test_checkpoint_rollout_and_a_short_rlpd_run(self, tmp_path: Path) -> None:
        spec = load_spec(SPECS / "rlpd.yaml")
        learner = Learner(spec, 10, 2)
        save_checkpoint(tmp_path / "ckpt", spec, CheckpointParts(learner=learner.state_dict()))
        out = tmp_path / "policy.parquet"
        code = cli.main(
            [
                "rollout",
                str(SPECS / "rlpd.yaml"),
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "--episodes",
                "2",
                "--deterministic",
                "--out",
                str(out),
            ]
        )
        assert code == 0
        data = read_dataset(out, expect_env_id=PUSHER)
        assert data.meta.producer == str((tmp_path / "ckpt").resolve())
        arrays = data.read_all()
        # deterministic rollout of the checkpoint's policy: the actions are its mean actions
        with torch.no_grad():
            expected = learner.algo.policy.act(arrays[ds.OBS], deterministic=True)
        np.testing.assert_allclose(arrays[ds.ACTIONS], expected, atol=1e-6)

        # the dataset feeds a (very short) RLPD run end to end
        run = load_spec(
            SPECS / "rlpd.yaml",
            rlpd_overrides(
                out,
                "budget.env_steps=300",
                "algo.warm_up_steps=100",
                "algo.batch_size=32",
                "eval.every_env_steps=300",
                "checkpoint.save_replay=false",
                f"runtime.output_dir={tmp_path / 'runs'}",
            ),
        )
        result = Trainer(run, live=False).run()
        assert result.env_steps >= 300 and result.prior_size == 100
