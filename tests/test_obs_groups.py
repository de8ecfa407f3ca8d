"""Grouped (Dict) observations: the spec names the keys the actor and the critic read; the actor,
and so every deployed policy, never reads the others; each key keeps its own stored column; every
mistake in the key lists is named before anything runs. (The asymmetric critic's learning claim is
in test_learning.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from aa_ray.api import Experiment, load_policy
from aa_ray.envs import env_dims
from aa_ray.errors import SpecError
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
USER_ENVS = ROOT / "tests" / "user_envs"
GROUPED = {"env.kwargs": {"obs_groups": True}, "algo.actor_obs": ["proprio", "command"],
           "algo.critic_obs": ["proprio", "command", "privileged"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short inline SAC run on pusher-reach's grouped observations: its final checkpoint."""
    out = tmp_path_factory.mktemp("grouped")
    overrides = {**GROUPED, "budget.env_steps": 1200, "algo.warm_up_steps": 500, "eval.every_env_steps": 600,
                 "eval.episodes": 2, "algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32],
                 "runtime.backend": "inline", "runtime.output_dir": str(out), "algo.normalize_obs": True}
    return Experiment(SPECS / "sac.yaml", overrides).fit(track=False, progress="plain").checkpoint


def test_the_deployed_policy_reads_the_actors_keys_only(trained: Path, tmp_path: Path) -> None:
    policy = load_policy(trained)
    assert policy.obs_keys == ("proprio", "command") and policy.obs_dim == 8
    rng = np.random.default_rng(0)
    obs = {"proprio": rng.uniform(-1, 1, (5, 6)), "command": rng.uniform(-0.2, 0.2, (5, 2))}
    actions = policy.predict(obs)
    # whatever the privileged key holds, the actions are the same: the actor does not read it
    for privileged in (np.zeros((5, 2)), rng.normal(size=(5, 2)) * 100):
        np.testing.assert_array_equal(policy.predict({**obs, "privileged": privileged}), actions)
    flat = np.concatenate([obs["proprio"], obs["command"]], axis=1).astype(np.float32)
    np.testing.assert_array_equal(policy.predict(flat), actions)
    with pytest.raises(ValueError, match="reads observation keys"):
        policy.predict({"proprio": obs["proprio"]})
    # the exported files take the actor's 8 features, and act as the policy does
    import onnxruntime

    onnx_file = policy.export(tmp_path / "policy.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(onnx_file))
    assert session.get_inputs()[0].shape[-1] == 8
    np.testing.assert_allclose(session.run(None, {"obs": flat})[0], actions, atol=1e-5)
    scripted = torch.jit.load(str(policy.export(tmp_path / "policy.pt", "torchscript")))
    np.testing.assert_allclose(scripted(torch.from_numpy(flat)).numpy(), actions, atol=1e-6)


def test_each_key_is_its_own_replay_column(trained: Path) -> None:
    names = pq.read_schema(trained / "replay.parquet").names
    for field in ("obs", "next_obs"):
        assert [n for n in names if n.startswith(field + "/")] == [f"{field}/{k}" for k in
                                                                   ("proprio", "command", "privileged")]
    rows = pq.read_table(trained / "replay.parquet")
    proprio = np.stack(rows.column("obs/proprio").to_numpy(zero_copy_only=False))
    assert proprio.shape[1] == 6 and np.all(np.abs(proprio[:, :4]) <= 1.0)  # cos and sin of the joints
    replay = ReplayBuffer(2000, 10, 2, seed=0, obs_groups=(("proprio", 6), ("command", 2), ("privileged", 2)))
    replay.load_table(rows)
    np.testing.assert_array_equal(replay.storage.obs[: len(proprio), :6], proprio)
    again = replay.to_table()
    assert again.column_names == rows.column_names and again.equals(rows.replace_schema_metadata(again.schema.metadata))


def test_ppo_and_td3_read_grouped_observations_too() -> None:
    for spec_file in ("ppo.yaml", "td3.yaml"):
        spec = load_spec(SPECS / spec_file, ["env.kwargs={obs_groups: true}", "algo.actor_obs=[proprio, command]",
                                             "algo.critic_obs=[proprio, command, privileged]"])
        obs, act_dim = env_dims(spec)
        assert (obs.actor, obs.full, act_dim) == (8, 10, 2)


@pytest.fixture
def goal_env(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.syspath_prepend(str(USER_ENVS))
    sys.modules.pop("myenvs", None)
    return ["env.entry_point=myenvs.point:GoalPointReachEnv", "env.max_episode_steps=40"]


def test_a_goal_envs_dict_trains_with_its_three_keys(goal_env: list[str]) -> None:
    spec = load_spec(SPECS / "sac_pendulum.yaml", goal_env)
    obs, _ = env_dims(spec)  # every key, for both (the Dict's own, sorted, order)
    assert obs.groups == (("achieved_goal", 2), ("desired_goal", 2), ("observation", 2)) and obs.actor == 6


@pytest.mark.parametrize("sets, expected", [
    (["algo.actor_obs=[observation, goal]"], "algo.actor_obs: the env's observations have no key 'goal'"),
    (["algo.actor_obs=[observation]", "algo.critic_obs=[desired_goal]"],
     "algo.critic_obs must include every key the actor sees; add observation"),
    (["algo.actor_obs=[observation, observation]"], "algo.actor_obs names a key twice"),
    (["env.kwargs={with_mode: true}"], "observation key 'mode' is Discrete(3)"),
])
def test_key_mistakes_are_named_before_anything_runs(goal_env: list[str], sets: list[str], expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        env_dims(load_spec(SPECS / "sac_pendulum.yaml", [*goal_env, *sets]))
    assert expected in str(caught.value)


def test_keys_for_a_flat_box_env_are_refused() -> None:
    with pytest.raises(SpecError, match="not a Dict: leave both out"):
        env_dims(load_spec(SPECS / "sac.yaml", ["algo.actor_obs=[proprio]"]))


def test_with_mode_left_out_of_both_lists_is_fine(goal_env: list[str]) -> None:
    spec = load_spec(SPECS / "sac_pendulum.yaml", [*goal_env, "env.kwargs={with_mode: true}",
                                                    "algo.actor_obs=[observation, desired_goal]"])
    obs, _ = env_dims(spec)
    assert obs.groups == (("observation", 2), ("desired_goal", 2)) and obs.actor == 4


def test_a_dataset_keeps_one_column_per_key_and_reads_back_whole(tmp_path: Path) -> None:
    from aa_ray.data.dataset import DatasetError, dataset_meta, write_dataset
    from aa_ray.data.sources import checked_prior_data, read_dataset
    from aa_ray.rollout.recorder import DatasetRecorder

    sets = [f"{key}={value}" for key, value in (("env.kwargs", "{obs_groups: true}"),
                                                 ("algo.actor_obs", "[proprio, command]"),
                                                 ("algo.critic_obs", "[proprio, command, privileged]"))]
    spec = load_spec(SPECS / "sac.yaml", sets)
    recorder = DatasetRecorder(spec, 0)
    transitions, _ = recorder.rollout(2, first_eps_id=0)
    path = write_dataset(tmp_path / "grouped.parquet", transitions, dataset_meta(spec, "test"))
    names = pq.read_schema(path).names
    assert {"obs/proprio", "obs/command", "obs/privileged", "new_obs/privileged"} <= set(names) and "obs" not in names
    back = read_dataset(path).read_all()
    np.testing.assert_array_equal(back["obs"], transitions["obs"])
    np.testing.assert_array_equal(back["new_obs"], transitions["new_obs"])
    obs, act_dim = env_dims(spec)
    grouped = spec.model_copy(update={"algo": spec.algo.model_copy(update={"prior_data": str(path)})})
    assert checked_prior_data(grouped, obs, act_dim) == path
    # a run that lays the keys out otherwise (same width, another order) is refused, naming both
    other = load_spec(SPECS / "sac.yaml", [sets[0], "algo.actor_obs=[command, proprio]",
                                           "algo.critic_obs=[command, proprio, privileged]"])
    other = other.model_copy(update={"algo": other.algo.model_copy(update={"prior_data": str(path)})})
    with pytest.raises(DatasetError, match="holds observation keys"):
        checked_prior_data(other, env_dims(other)[0], act_dim)
