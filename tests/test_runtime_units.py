"""The runtime's plain objects, used in-process: env runner semantics, replay, learner, checkpoints."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from aa_ray.records import Batch, CheckpointParts, NormMoments, PackedTransitions, Transitions
from aa_ray.runtime.checkpoint import (
    CheckpointError,
    check_compatible,
    load_checkpoint,
    newest_checkpoint,
    save_checkpoint,
)
from aa_ray.runtime.counters import Window
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.inline import InlineActors
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.loops import Iteration
from aa_ray.runtime.remote import get_results
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import apply_overrides, validate_spec


class CountingEnv(gym.Env):
    """obs = [steps taken in this episode]; terminates after `terminate_at` steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, terminate_at: int = 10_000):
        self.terminate_at = terminate_at
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.terminate_at, False, {}


gym.register("aa_ray_tests/Counting-v0", entry_point=CountingEnv, max_episode_steps=5)


class ScoredEnv(CountingEnv):
    """CountingEnv that declares a task metric, `score` (10 x the steps taken), and reports it only
    at the step that terminates an episode, as gymnasium-robotics envs do with some keys."""

    metadata = {"render_modes": [], "info_metrics": ["score"]}

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, ({"score": 10.0 * self.t, "label": "done"} if terminated else {})


gym.register("aa_ray_tests/Scored-v0", entry_point=ScoredEnv, max_episode_steps=5)


def counting_spec(terminate_at: int, algo: str = "sac", **extra: str):
    nets = (
        {"actor_hidden_dims": [16], "critic_hidden_dims": [16]} if algo == "sac"
        else {"critic_hidden_dim": 32, "actor_hidden_dim": 16}
    )
    raw = {
        "name": "counting",
        "env": {"id": "aa_ray_tests/Counting-v0", "kwargs": {"terminate_at": terminate_at}},
        "algo": {"name": algo, "warm_up_steps": 10, "batch_size": 8, "buffer_size": 100, **nets},
        "budget": {"env_steps": 1000},
        "runners": {"envs_per_runner": 2},
    }
    return validate_spec(apply_overrides(raw, [f"{k}={v}" for k, v in extra.items()]))


class ThreadProbe:
    def threads(self) -> int:
        return torch.get_num_threads()


def test_actors_set_no_thread_count_their_inline_shell_keeps_it_apart() -> None:
    """Building a learner or a runner leaves the process's torch thread count alone; an inline actor's
    shell runs each call at the actor's own count and gives the driver its own back."""
    driver = torch.get_num_threads()
    spec = counting_spec(3, **{"learners.torch_threads": driver + 2, "runners.torch_threads": driver + 1})
    Learner(spec, 3, 1), EnvRunner(spec, 0)
    assert torch.get_num_threads() == driver
    probe = InlineActors().start(ThreadProbe, bundle=0, num_cpus=1, torch_threads=driver + 2)
    assert get_results(probe.threads.remote()) == driver + 2 and torch.get_num_threads() == driver


def test_terminated_is_stored_and_autoreset_step_is_not() -> None:
    runner = EnvRunner(counting_spec(terminate_at=3), index=0)
    transitions, stats = runner.sample(num_steps=12, random_actions=True)
    obs, next_obs = transitions.obs[:, 0], transitions.next_obs[:, 0]
    # within an episode the counter goes up by exactly one; an autoreset step would go 3 -> 0
    assert np.all(next_obs == obs + 1)
    assert np.all(transitions.terminated == (next_obs == 3))
    assert not transitions.truncated.any()
    # 12 vector steps on 2 envs, each episode is 3 steps + 1 reset step -> 3 episodes x 3 per env
    assert stats.env_steps == 18 == len(obs)
    assert [e.episode_return for e in stats.episodes] == [3.0] * 6


def test_truncated_is_not_terminated() -> None:
    runner = EnvRunner(counting_spec(terminate_at=10_000), index=0)
    transitions, _ = runner.sample(num_steps=7, random_actions=True)
    next_obs = transitions.next_obs[:, 0]
    assert np.all(transitions.truncated == (next_obs == 5))  # time limit of 5 steps
    assert transitions.truncated.sum() == 2
    assert not transitions.terminated.any()


def test_task_metrics_are_the_info_keys_the_env_declares_or_the_spec_lists() -> None:
    """ScoredEnv declares `score` and reports it only on its last step (the `_score` mask says which
    copy did); it has no is_success, so no eval/success. A listed key the env never reports is left
    out; one that is not a number is refused naming it."""
    spec = counting_spec(3, **{"env.id": "aa_ray_tests/Scored-v0", "eval.info_metrics": "[absent]"})
    runner = EnvRunner(spec, index=0)
    assert runner.info_keys == ("is_success", "score", "absent")
    evaluation = runner.evaluate(3)
    assert evaluation == {"eval/return": 3.0, "eval/length": 3.0, "eval/score": 30.0}
    _, stats = runner.sample(num_steps=8, random_actions=True)  # 2 episodes per copy, reset steps between
    assert [e.info for e in stats.episodes] == [{"score": 30.0}] * 4
    window = Window()
    window.count(Iteration(chunks=[stats]))
    assert window.metrics()["train/score"] == 30.0 and "train/success" not in window.metrics()
    # a counting env has no task metrics at all: return and length only
    assert set(EnvRunner(counting_spec(3), index=0).evaluate(2)) == {"eval/return", "eval/length"}
    labelled = counting_spec(3, **{"env.id": "aa_ray_tests/Scored-v0", "eval.info_metrics": "[label]"})
    with pytest.raises(ValueError, match=r"info\['label'\] is not a number \(got 'done'\)"):
        EnvRunner(labelled, index=0).evaluate(1)


def test_n_step_windows_stop_at_a_terminal() -> None:
    """3-step returns with gamma 0.5 on an episode that terminates after 4 steps (rewards 1 each):
    starts 0 and 1 see 3 rewards and bootstrap from s3 / s4 (s4 terminal); starts 2 and 3 are cut
    by the terminal: 1 + 0.5 and 1, both terminal."""
    spec = counting_spec(4, **{"algo.n_step": 3, "algo.gamma": 0.5, "runners.envs_per_runner": 1})
    runner = EnvRunner(spec, index=0)
    first, _ = runner.sample(num_steps=2, random_actions=True)
    assert len(first.reward) == 0  # no window is complete yet
    t, _ = runner.sample(num_steps=4, random_actions=True)  # steps 3-4, the reset step, step 1 of the next
    assert t.obs[:, 0].tolist() == [0, 1, 2, 3]
    assert t.next_obs[:, 0].tolist() == [3, 4, 4, 4]
    assert t.reward.tolist() == [1.75, 1.75, 1.5, 1.0]
    assert t.discount.tolist() == [0.125, 0.125, 0.25, 0.5]
    assert t.terminated.tolist() == [0, 1, 1, 1]


def one_transition(terminated: float, truncated: float, discount: float) -> Transitions:
    """A learner's sample of one fleet step (utd 1) holding one transition, shapes (1, 1, ...)."""
    return Transitions(
        obs=np.zeros((1, 1, 1), np.float32),
        action=np.zeros((1, 1, 1), np.float32),
        reward=np.full((1, 1), 0.5, np.float32),
        next_obs=np.ones((1, 1, 1), np.float32),
        terminated=np.full((1, 1), terminated, np.float32),
        truncated=np.full((1, 1), truncated, np.float32),
        discount=np.full((1, 1), discount, np.float32),
    )


def td_target(sample: Transitions) -> float:
    """SAC's TD target for `sample`, from a fresh learner: every call builds the same networks
    (the learner seeds torch from the spec's seed) and draws the same a' ~ pi(.|s')."""
    learner = Learner(counting_spec(terminate_at=3), obs_dim=1, act_dim=1)
    return learner.update([], sample).metrics["critic/td_target"]


def test_only_a_terminal_masks_the_bootstrap() -> None:
    """target = r + discount * (1 - terminated) * soft V(s'): r for a terminal transition; for a
    time-limit truncation exactly the target of the same transition had the episode gone on."""
    reward = 0.5
    terminal = td_target(one_transition(terminated=1, truncated=0, discount=0.99))
    running = td_target(one_transition(terminated=0, truncated=0, discount=0.99))
    truncated = td_target(one_transition(terminated=0, truncated=1, discount=0.99))
    truncated_short = td_target(one_transition(terminated=0, truncated=1, discount=0.5))
    assert terminal == pytest.approx(reward, abs=1e-6)
    soft_value = (running - reward) / 0.99  # V(s') of these networks and this a'
    assert abs(soft_value) > 1e-3  # so a masked bootstrap could not pass for an unmasked one
    assert truncated == running
    assert truncated_short == pytest.approx(reward + 0.5 * soft_value, rel=1e-5)


def test_a_batch_carries_what_the_bootstrap_reads_exactly() -> None:
    """The learner's Batch keeps `terminated` and the k-step `discount` bit for bit; `truncated`
    has no field because no algorithm may read it (a time limit never masks the bootstrap)."""
    terminated = np.array([[1, 0, 0, 1]], np.float32)
    discount = (0.97 ** np.arange(1, 5)).astype(np.float32)[None]  # k-step discounts, k = 1..4
    rows = Transitions(
        obs=np.zeros((1, 4, 1), np.float32), action=np.zeros((1, 4, 1), np.float32),
        reward=np.zeros((1, 4), np.float32), next_obs=np.zeros((1, 4, 1), np.float32),
        terminated=terminated, truncated=1 - terminated, discount=discount,
    )
    batch = Batch.from_transitions(rows, torch.device("cpu"))
    assert torch.equal(batch.terminated, torch.from_numpy(terminated))
    assert torch.equal(batch.discount, torch.from_numpy(discount))
    assert "truncated" not in Batch._fields


def make_chunk(start: int, n: int) -> Transitions:
    ids = np.arange(start, start + n, dtype=np.float32)
    return Transitions(
        obs=np.stack([ids, -ids], 1),
        action=ids[:, None] / 1e4,
        reward=ids,
        next_obs=np.stack([ids + 1, ids], 1),
        terminated=(ids % 7 == 0).astype(np.float32),
        truncated=np.zeros(n, np.float32),
        discount=np.full(n, 0.99, np.float32),
    )


def test_replay_ring_keeps_the_newest_transitions() -> None:
    replay = ReplayBuffer(capacity=10, obs_dim=2, act_dim=1, seed=0)
    assert replay.add(make_chunk(0, 6), make_chunk(6, 6)) == 10
    assert sorted(replay.storage.reward.tolist()) == list(range(2, 12))
    batch = replay.sample(num_batches=3, batch_size=4)
    assert batch.obs.shape == (3, 4, 2) and batch.reward.shape == (3, 4)
    # fields stay aligned row by row
    assert np.all(batch.obs[..., 0] == batch.reward) and np.all(batch.next_obs[..., 0] == batch.reward + 1)


def test_packed_rows_carry_every_field_to_the_learner_unchanged() -> None:
    """The replay stores packed rows and a learner splits them: what reaches an update is, field by
    field, the rows the runners wrote, whatever the fleet-step slicing."""
    chunk = make_chunk(0, 12)
    packed = PackedTransitions.pack(chunk)
    assert packed.table.shape == (12, 2 * 2 + 1 + 4)
    for field, original in zip(packed.unpack(), chunk, strict=True):
        np.testing.assert_array_equal(field, original)
    replay = ReplayBuffer(capacity=20, obs_dim=2, act_dim=1, seed=0)
    replay.add(chunk)
    sample = replay.sample_for_learners(num_batches=4, batch_size=3, num_learners=1).transitions
    sample.table.flags.writeable = False  # as it arrives from Ray's object store
    learner = Learner(counting_spec(3), obs_dim=2, act_dim=1)
    batches = list(learner.feed.fleet_steps([sample], utd=2))  # what the family's learn trains on
    assert len(batches) == 2 and batches[0].obs.shape == (2, 3, 2)
    unpacked = sample.unpack()
    for name in Batch._fields:
        stacked = torch.cat([getattr(b, name) for b in batches])
        np.testing.assert_array_equal(stacked.numpy(), getattr(unpacked, name))
        assert stacked.is_contiguous()


def test_replay_parquet_round_trip_samples_identically(tmp_path: Path) -> None:
    replay = ReplayBuffer(capacity=50, obs_dim=2, act_dim=1, seed=3)
    replay.add(make_chunk(0, 70))
    replay.sample(2, 5)
    pq.write_table(replay.to_table(), tmp_path / "replay.parquet")
    restored = ReplayBuffer(capacity=50, obs_dim=2, act_dim=1, seed=99)
    restored.load_table(pq.read_table(tmp_path / "replay.parquet"), replay.state())
    a, b = replay.sample(4, 16), restored.sample(4, 16)
    for column_a, column_b in zip(a, b, strict=True):
        np.testing.assert_array_equal(column_a, column_b)
    wrong = ReplayBuffer(capacity=50, obs_dim=3, act_dim=1, seed=0)
    with pytest.raises(ValueError, match="obs/action dims 2,1"):
        wrong.load_table(pq.read_table(tmp_path / "replay.parquet"))


@pytest.mark.parametrize("algo", ["sac", "sac_simba"])
def test_checkpoint_round_trip_restores_parameters_and_optimizers(tmp_path: Path, algo: str) -> None:
    spec = counting_spec(3, algo, **{"algo.utd_ratio": 2})
    learner = Learner(spec, obs_dim=1, act_dim=1)
    replay = ReplayBuffer(100, 1, 1, seed=0)
    runner = EnvRunner(spec, 0)
    replay.add(runner.sample(20, random_actions=True)[0])
    moments = NormMoments((5, np.ones(1), np.ones(1)), (5, 1.0, 2.0, 3.0))
    learner.update([moments], replay.sample(4 * spec.algo.utd_ratio, 8))

    save_checkpoint(tmp_path / "ckpt", spec, CheckpointParts(learner=learner.state_dict()))
    payload = load_checkpoint(tmp_path / "ckpt")
    check_compatible(spec, payload)
    restored = Learner(spec, obs_dim=1, act_dim=1)
    restored.load_state_dict(payload.learner)

    for name in ("policy", "critic", "critic_target", "reward_norm"):
        for (k, a), (_, b) in zip(
            getattr(learner.algo.agent, name).state_dict().items(),
            getattr(restored.algo.agent, name).state_dict().items(),
            strict=True,
        ):
            assert torch.equal(a, b), f"{name}.{k}"
    for name in ("actor_step", "critic_step", "alpha_step"):
        saved = getattr(learner.algo.agent, name).optimizer.state_dict()
        loaded = getattr(restored.algo.agent, name).optimizer.state_dict()
        for key, slot in saved["state"].items():
            for field, value in slot.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(loaded["state"][key][field])), (name, field)
    # the same next update from both gives the same numbers
    batches = replay.sample(spec.algo.utd_ratio, 8)
    torch.manual_seed(0)
    a = learner.update([], batches).metrics
    torch.manual_seed(0)
    b = restored.update([], batches).metrics
    assert a["critic/q_loss"] == b["critic/q_loss"] and a["actor/loss"] == b["actor/loss"]


def test_a_stack_that_is_not_whole_fleet_steps_is_refused_not_cut() -> None:
    """3 batches at utd_ratio 2 are one and a half fleet steps: the learner says so and learns
    nothing, rather than dropping the odd batch."""
    spec = counting_spec(3, **{"algo.utd_ratio": 2})
    learner = Learner(spec, obs_dim=1, act_dim=1)
    replay = ReplayBuffer(100, 1, 1, seed=0)
    replay.add(EnvRunner(spec, 0).sample(20, random_actions=True)[0])
    before = learner.parameters_vector()
    with pytest.raises(ValueError, match=r"3 batches, not a whole number of fleet steps of algo.utd_ratio=2"):
        learner.update([], replay.sample(3, 8))
    assert torch.equal(learner.parameters_vector(), before) and learner.weights_version == 0


def test_newest_checkpoint_skips_one_a_crash_left_half_written(tmp_path: Path) -> None:
    spec = counting_spec(3)
    assert newest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path / "step_000000300", spec, CheckpointParts())
    # killed while writing the next one: its folder already holds a truncated state file
    (tmp_path / "step_000000600.partial").mkdir()
    (tmp_path / "step_000000600.partial" / "state.pt").write_bytes(b"PK\x03\x04 cut short")
    assert newest_checkpoint(tmp_path) == tmp_path / "step_000000300"
    load_checkpoint(newest_checkpoint(tmp_path))
    save_checkpoint(tmp_path / "final", spec, CheckpointParts())
    assert newest_checkpoint(tmp_path) == tmp_path / "final"


def test_corrupt_and_incompatible_checkpoints_are_explained(tmp_path: Path) -> None:
    spec = counting_spec(3)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "state.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupt or not an aa-ray checkpoint"):
        load_checkpoint(tmp_path / "bad")
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing")
    save_checkpoint(tmp_path / "ok", spec, CheckpointParts())
    other = counting_spec(3, **{"algo.critic_hidden_dims": "[32]"})
    with pytest.raises(CheckpointError, match=r"algo.critic_hidden_dims: checkpoint has \[16\], spec has \[32\]"):
        check_compatible(other, load_checkpoint(tmp_path / "ok"))
    # a budget change is a legitimate resume
    check_compatible(counting_spec(3, **{"budget.env_steps": 5000}), load_checkpoint(tmp_path / "ok"))
