"""`runtime.replay_shards`: the replay buffer split over several replay actors. Each learner batch
draws its rows from every shard (the RLPD dataset's from shard 0, first), a run resumes from a
checkpoint of its shards exactly, the inline backend repeats the Ray backend's sharded run, and the
spec refuses shards where they cannot work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from test_datasets import fake_transitions, pusher_meta
from test_inline_backend import PENDULUM, TINY, tensors

from aa_ray.data.dataset import write_dataset
from aa_ray.errors import SpecError
from aa_ray.records import Transitions, prior_rows, rows_per_replay_shard
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.learner import DeviceFeed
from aa_ray.runtime.replay import ReplayBuffer, join_shards, split_shards
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

SHARDED = [*TINY, "runtime.replay_shards=2", "runners.num_runners=4", "algo.buffer_size=600"]


def filled(shard: int, rows: int, marker: float, capacity: int = 50) -> ReplayBuffer:
    """A shard whose every stored reward is `marker` (so a batch shows which shard a row came from)."""
    buffer = ReplayBuffer(capacity, obs_dim=3, act_dim=2, seed=7, shard=shard)
    chunk = Transitions.empty(rows, 3, 2)
    chunk.reward[:] = marker
    chunk.obs[:] = np.arange(rows)[:, None]
    buffer.add(chunk)
    return buffer


def test_rows_per_shard_add_up_to_the_batch_with_the_prior_rows_on_shard_0() -> None:
    for batch, ratio, shards in ((256, 0.0, 2), (256, 0.5, 4), (255, 0.5, 4), (10, 0.25, 3), (3, 0.0, 4)):
        prior = prior_rows(batch, ratio)
        split = rows_per_replay_shard(batch, prior, shards)
        assert len(split) == shards and sum(p + o for p, o in split) == batch
        assert split[0][0] == prior and all(p == 0 for p, _ in split[1:])
        online = [o for _, o in split]
        assert max(online) - min(online) <= 1, split


def test_a_learners_batch_lays_the_shards_parts_side_by_side_after_the_prior_rows(tmp_path: Path) -> None:
    shard0, shard1 = filled(0, 40, marker=1.0), filled(1, 40, marker=2.0)
    shard0.prior = filled(0, 30, marker=-1.0)  # stands in for a loaded dataset
    shard0.prior_ratio = 0.25
    split = rows_per_replay_shard(8, prior_rows(8, 0.25), 2)  # [(2, 3), (0, 3)]
    parts = [shard.sample_part(5, n_prior, n_online, num_learners=1) for shard, (n_prior, n_online)
             in zip((shard0, shard1), split, strict=True)]
    # what the learner trains on: its feed lays the parts side by side in every batch
    feed = DeviceFeed(torch.device("cpu"))
    batches = list(feed.fleet_steps([part.transitions for part in parts], utd=1))
    rewards = torch.cat([batch.reward for batch in batches])
    assert len(batches) == 5 and rewards.shape == (5, 8)
    assert (rewards[:, :2] == -1).all() and (rewards[:, 2:5] == 1).all() and (rewards[:, 5:] == 2).all()
    assert torch.equal(torch.cat([batch.obs for batch in batches])[:, 2:5],
                       torch.from_numpy(parts[0].transitions.unpack().obs[:, 2:]))
    # two learners: each gets its own draw of the same layout
    first, second = shard1.sample_part(5, 0, 3, num_learners=2)
    assert first.transitions.table.shape == second.transitions.table.shape == (5, 3, 2 * 3 + 2 + 4)
    with pytest.raises(RuntimeError, match="replay shard 1 holds no prior dataset"):
        shard1.sample_part(1, 2, 3, num_learners=1)


def test_shards_draw_from_streams_of_their_own_and_shard_0_from_the_unsharded_buffers() -> None:
    def draws(buffer: ReplayBuffer) -> np.ndarray:
        return buffer.sample_packed(4, 6).unpack().obs[..., 0]

    unsharded = ReplayBuffer(50, obs_dim=3, act_dim=2, seed=7)
    unsharded.add(filled(0, 40, 0.0).rows.take(np.arange(40)).unpack())
    assert np.array_equal(draws(filled(0, 40, 0.0)), draws(unsharded))
    assert not np.array_equal(draws(filled(0, 40, 0.0)), draws(filled(1, 40, 0.0)))


def test_a_checkpoints_table_splits_back_into_its_shards_or_deals_its_rows_to_another_count() -> None:
    shards = [filled(0, 30, 1.0), filled(1, 45, 2.0)]
    shards[1].add(Transitions.empty(10, 3, 2))  # past the capacity: this shard's cursor wrapped
    joined = join_shards([shard.to_table() for shard in shards])
    states = {"shards": [shard.state() for shard in shards]}
    assert joined.num_rows == 30 + 50
    tables, saved = split_shards(joined, states, 2)
    for shard, table, state in zip(shards, tables, saved, strict=True):
        again = ReplayBuffer(50, obs_dim=3, act_dim=2, seed=0, shard=shard.shard)
        again.load_table(table, state)
        assert (again.size, again.cursor, again.total_added) == (shard.size, shard.cursor, shard.total_added)
        assert np.array_equal(again.rows.table, shard.rows.table)
        assert np.array_equal(again.sample_packed(3, 4).table, shard.sample_packed(3, 4).table)
    # another shard count: every row kept, dealt out evenly, fresh sampling streams
    tables, saved = split_shards(joined, states, 3)
    assert [t.num_rows for t in tables] == [26, 27, 27] and saved == [None, None, None]
    one, saved = split_shards(joined, states, 1)
    assert one[0].num_rows == 80 and saved == [None]
    buffer = ReplayBuffer(80, obs_dim=3, act_dim=2, seed=0)
    buffer.load_table(one[0], saved[0])
    assert sorted(np.unique(buffer.storage.reward[:80])) == [0.0, 1.0, 2.0]
    # one buffer's table and state pass through as they are
    single = filled(0, 20, 1.0)
    tables, saved = split_shards(join_shards([single.to_table()]), single.state(), 1)
    assert tables[0].num_rows == 20 and saved == [single.state()]


@pytest.mark.parametrize("spec, overrides, named", [
    ("sac_pendulum.yaml", ["runners.num_runners=4", "runtime.replay_shards=3"], "must divide runners.num_runners"),
    ("ppo.yaml", ["runners.num_runners=2", "runtime.replay_shards=2"], "learns on-policy"),
    ("fasttd3_point_reach.yaml", ["runtime.replay_shards=2"], "keeps a replay ring in each learner"),
])
def test_the_spec_refuses_shards_it_cannot_use(spec: str, overrides: list[str], named: str) -> None:
    with pytest.raises(SpecError, match=f"runtime.replay_shards(.|\\n)*{named}"):
        load_spec(PENDULUM.with_name(spec), overrides)


@pytest.fixture(scope="module")
def sharded_ray() -> Iterator[None]:
    """One Ray for the file's two Ray runs (neither kills anything), joined as `one_ray`'s (tests/conftest.py)
    instead of each starting and stopping its own; 6 CPUs, what the larger (four runners, a learner and
    two replay shards) would have started."""
    ray.init(address="local", num_cpus=6, include_dashboard=False)  # never a cluster another test started
    yield
    ray.shutdown()


def final_state(run_dir: Path, overrides: list[str], resume: Path | None = None):  # noqa: ANN201
    spec = load_spec(PENDULUM, [*SHARDED, *overrides])
    result = Trainer(spec, run_dir=run_dir, live=False, resume=load_checkpoint(resume) if resume else None).run()
    return result, tensors(load_checkpoint(result.checkpoint).learner)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differing = [path for path, t in a.items() if not torch.equal(t, b[path])]
    assert not differing, f"learner state differs at {differing}"


@pytest.mark.usefixtures("sharded_ray")
def test_a_sharded_run_repeats_on_ray_inline_and_from_a_checkpoint_of_its_shards(tmp_path: Path) -> None:
    """Four runners into two shards: Ray and inline give the same run; the inline run resumed from its
    checkpoint at 400 env steps (both shards' rows, cursors and sampling streams) ends as the whole."""
    mid_run = "checkpoint.every_env_steps=400"
    ray_run, ray_state = final_state(tmp_path / "ray", ["runtime.backend=ray", mid_run])
    inline, inline_state = final_state(tmp_path / "inline", ["runtime.backend=inline", mid_run])
    assert inline.evals == ray_run.evals and inline.replay_size == ray_run.replay_size == 600
    assert_same(inline_state, ray_state)
    middle = min((tmp_path / "inline").glob("**/checkpoints/step_*"))  # the first, mid-run
    assert 400 <= load_checkpoint(middle).driver.counters.env_steps < 800
    assert load_checkpoint(middle).replay.keys() == {"shards"}
    resumed, resumed_state = final_state(tmp_path / "resumed", ["runtime.backend=inline"], resume=middle)
    assert resumed.evals[-1] == inline.evals[-1]
    assert_same(resumed_state, inline_state)


@pytest.mark.usefixtures("sharded_ray")
def test_an_async_rlpd_run_adds_to_its_runners_shards_and_draws_the_dataset_from_shard_0(tmp_path: Path) -> None:
    """Ray, async: each chunk goes to its runner's shard as it lands; shard 0 alone loads the dataset,
    and the learners' batches draw its rows from there (a shard without it would refuse to)."""
    prior = write_dataset(tmp_path / "prior.parquet", fake_transitions(400), pusher_meta())
    spec = load_spec(PENDULUM.with_name("rlpd.yaml"), [
        f"algo.prior_data={prior}", "tracking.enabled=false", "checkpoint.save_replay=false",
        "runtime.mode=async", "runtime.replay_shards=2", "runners.num_runners=2", "budget.env_steps=600",
        "algo.warm_up_steps=100", "algo.batch_size=32", "eval.every_env_steps=600", "eval.episodes=1",
        f"runtime.output_dir={tmp_path / 'runs'}",
    ])
    result = Trainer(spec, live=False).run()
    assert result.prior_size == 400 and result.replay_size == result.env_steps >= 600
    assert load_checkpoint(result.checkpoint).learner.gradient_updates > 0
