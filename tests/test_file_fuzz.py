"""Input hardening for files: truncated, damaged, foreign-env, wrong-version and wrong-shape
checkpoints, replay files and datasets are rejected with an error naming the file and the mismatch
(CheckpointError / DatasetError), never a traceback from torch or pyarrow. The damage is drawn by
hypothesis (derandomized, so CI sees the same cases every run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.registry import build_algorithm
from aa_ray.data import dataset as ds
from aa_ray.data.dataset import DatasetError, DatasetMeta, write_dataset
from aa_ray.data.sources import read_dataset
from aa_ray.records import CheckpointParts, DriverCheckpoint, RunCounters, Transitions
from aa_ray.runtime.checkpoint import (
    REPLAY_FILE,
    STATE_FILE,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    verify_resume,
)
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = ["algo.actor_hidden_dims=[32,32]",
    "algo.critic_hidden_dims=[32,32]", "runners.envs_per_runner=2", "tracking.enabled=false"]
SPEC = load_spec(SPECS / "sac.yaml", SMALL)
OBS_DIM, ACT_DIM = 10, 2
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def checkpoint_state(spec=SPEC, obs_dim: int = OBS_DIM, act_dim: int = ACT_DIM,
                     rows: int = 300) -> tuple[CheckpointParts, object]:
    """What a training run writes, made from the real pieces: learner, replay, runner, counters."""
    replay = ReplayBuffer(1000, obs_dim, act_dim, seed=0)
    rng = np.random.default_rng(0)
    replay.add(Transitions(
        obs=rng.normal(size=(rows, obs_dim)).astype(np.float32),
        action=rng.uniform(-1, 1, (rows, act_dim)).astype(np.float32),
        reward=rng.normal(size=rows).astype(np.float32),
        next_obs=rng.normal(size=(rows, obs_dim)).astype(np.float32),
        terminated=np.zeros(rows, np.float32), truncated=np.zeros(rows, np.float32),
        discount=np.full(rows, 0.99, np.float32),
    ))
    state = CheckpointParts(
        driver=DriverCheckpoint(RunCounters(env_steps=rows, iterations=30, episodes=6, next_eval=1000), [], [], {}),
        learner=Learner(spec, obs_dim, act_dim).state_dict(),
        replay=replay.state(),
        runners=[EnvRunner(spec, 0).state()] if obs_dim == OBS_DIM else [],
    )
    return state, replay.to_table()


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state, table = checkpoint_state()
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "step_000000300", SPEC, state, table)


def resume_check(folder: Path, spec=SPEC) -> object:
    """What `aa-ray run --resume` checks before Ray starts."""
    algorithm = build_algorithm(spec.algo, OBS_DIM, ACT_DIM, TrainingSetup.on_cpu(planned_steps=100))
    return verify_resume(load_checkpoint(folder), spec, algorithm, OBS_DIM, ACT_DIM)


def damaged_copy(source: Path, target: Path, damage) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    return damage(target) or target


def test_the_good_checkpoint_passes_and_its_replay_round_trips(good_checkpoint: Path) -> None:
    table = resume_check(good_checkpoint)
    assert table.num_rows == 300
    assert not list(good_checkpoint.parent.glob("*.partial"))  # written whole, then renamed into place


def truncate(name: str, fraction: float):
    """Damage: cut the checkpoint's file `name` to `fraction` of its length."""
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * fraction)])

    return damage


@pytest.mark.parametrize(("name", "says"), [(STATE_FILE, ""), (REPLAY_FILE, "truncated or corrupt")])
@FUZZ
@given(fraction=st.floats(0.0, 0.999))
def test_a_truncated_state_or_replay_file_is_rejected_naming_it(
    good_checkpoint: Path, tmp_path: Path, name: str, says: str, fraction: float
) -> None:
    folder = damaged_copy(good_checkpoint, tmp_path / "truncated", truncate(name, fraction))
    with pytest.raises(CheckpointError) as err:
        resume_check(folder)
    assert str(folder / name) in str(err.value) and says in str(err.value)


@FUZZ
@given(flips=st.lists(st.tuples(st.floats(0.0, 0.999), st.integers(1, 255)), min_size=1, max_size=8))
def test_a_damaged_state_file_is_rejected_or_still_whole(
    good_checkpoint: Path, tmp_path: Path, flips: list[tuple[float, int]]
) -> None:
    """Bytes flipped anywhere (zip headers, the pickle, tensor data): the checkpoint is either
    refused with a CheckpointError or, when only numbers changed, still a consistent checkpoint."""
    def flip(folder: Path) -> None:
        data = bytearray((folder / STATE_FILE).read_bytes())
        for where, mask in flips:
            data[int(len(data) * where)] ^= mask
        (folder / STATE_FILE).write_bytes(bytes(data))

    folder = damaged_copy(good_checkpoint, tmp_path / "flipped", flip)
    try:
        resume_check(folder)
    except CheckpointError as err:
        assert str(folder) in str(err)


def test_foreign_env_wrong_version_and_wrong_shape_checkpoints_name_the_mismatch(
    good_checkpoint: Path, tmp_path: Path
) -> None:
    pendulum = load_spec(SPECS / "sac_pendulum.yaml", SMALL)
    state, table = checkpoint_state(pendulum, obs_dim=3, act_dim=1)
    foreign = save_checkpoint(tmp_path / "pendulum", pendulum, state, table)

    def version(folder: Path) -> None:
        payload = torch.load(folder / STATE_FILE, weights_only=True)
        torch.save({**payload, "format_version": 99}, folder / STATE_FILE)

    wider = load_spec(SPECS / "sac.yaml", ["algo.actor_hidden_dims=[64,64]",
        "algo.critic_hidden_dims=[64,64]", *SMALL[1:]])
    wide_state, _ = checkpoint_state(wider)  # tensors for 64-unit layers under a spec that says 32
    shapes = save_checkpoint(tmp_path / "shapes", SPEC, wide_state)

    def other_replay(folder: Path) -> None:
        shutil.copy(foreign / REPLAY_FILE, folder / REPLAY_FILE)  # 3/1-dim rows beside a 10/2-dim state

    def fewer_rows(folder: Path) -> None:
        pq.write_table(checkpoint_state(rows=100)[1], folder / REPLAY_FILE)

    cases = [
        (foreign, "env.id: checkpoint has 'Pendulum-v1', spec has 'aa_ray/PusherReach-v0'"),
        (damaged_copy(good_checkpoint, tmp_path / "v99", version), "format version 99"),
        (shapes, "does not fit the spec's networks (size mismatch for"),
        (damaged_copy(good_checkpoint, tmp_path / "dims", other_replay), "obs/action dims 3,1, the env has 10,2"),
        (damaged_copy(good_checkpoint, tmp_path / "rows", fewer_rows), "holds 100 rows, its state.pt expects 300"),
    ]
    for folder, message in cases:
        with pytest.raises(CheckpointError) as err:
            resume_check(folder)
        assert str(folder) in str(err.value) and message in str(err.value), str(err.value)


# ---- datasets ------------------------------------------------------------------------------------


def pusher_dataset(path: Path, format_version: int = ds.FORMAT_VERSION, obs_dim: int = OBS_DIM) -> Path:
    obs_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    meta = DatasetMeta.for_env("aa_ray/PusherReach-v0", obs_space, act_space, "scripted", format_version=format_version)
    n, rng = 200, np.random.default_rng(0)
    return write_dataset(path, {
        ds.OBS: rng.normal(size=(n, obs_dim)).astype(np.float32),
        ds.ACTIONS: rng.uniform(-1, 1, (n, ACT_DIM)).astype(np.float32),
        ds.REWARDS: rng.normal(size=n).astype(np.float32),
        ds.NEXT_OBS: rng.normal(size=(n, obs_dim)).astype(np.float32),
        ds.TERMINATEDS: np.zeros(n, bool), ds.TRUNCATEDS: np.arange(n) % 50 == 49,
        ds.EPS_ID: np.arange(n) // 50, ds.T: np.arange(n) % 50,
    }, meta)


@FUZZ
@given(fraction=st.floats(0.0, 0.999))
def test_a_truncated_dataset_is_rejected_naming_it(tmp_path: Path, fraction: float) -> None:
    good = pusher_dataset(tmp_path / "good.parquet")
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: int(good.stat().st_size * fraction)])
    with pytest.raises(DatasetError) as err:
        read_dataset(truncated, expect_env_id="aa_ray/PusherReach-v0", expect_obs_dim=OBS_DIM, expect_act_dim=ACT_DIM)
    assert str(truncated) in str(err.value)


def test_foreign_env_wrong_version_and_wrong_shape_datasets_name_the_mismatch(tmp_path: Path) -> None:
    cases = [
        (pusher_dataset(tmp_path / "pusher.parquet"), {"expect_env_id": "Pendulum-v1"},
         "recorded on env 'aa_ray/PusherReach-v0', but this run's env is 'Pendulum-v1'"),
        (pusher_dataset(tmp_path / "v99.parquet", format_version=99), {}, "format version 99"),
        (pusher_dataset(tmp_path / "obs12.parquet", obs_dim=12), {"expect_obs_dim": OBS_DIM},
         "holds observations of dim 12, but this run's env has obs_dim 10"),
    ]
    for path, expect, message in cases:
        with pytest.raises(DatasetError) as err:
            read_dataset(path, **expect)
        assert str(path) in str(err.value) and message in str(err.value), str(err.value)
