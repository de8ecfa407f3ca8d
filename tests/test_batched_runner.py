"""The batched runner kind (`runners.kind: batched`): a batched env's chunks, n-step windows as
tensors, its state for a bit-exact resume, the Ray backend repeating the inline one, and the
runner contract's registry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aa_ray.runtime.batched_runner import BatchedRunner
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.nstep import NStepWindow
from aa_ray.runtime.runners import RUNNER_KINDS, Runner, runner_class
from aa_ray.runtime.tensor_steps import TensorNStep
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

SPEC = Path(__file__).resolve().parents[1] / "specs" / "sac_point_reach.yaml"
SMALL = [
    "runners.envs_per_runner=16", "algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]", "algo.batch_size=32",
    "algo.warm_up_steps=64", "algo.train_every=2", "algo.utd_ratio=1", "budget.env_steps=320",
    "eval.every_env_steps=160", "eval.episodes=4", "checkpoint.every_env_steps=160", "tracking.enabled=false",
    "runtime.backend=inline", "env.max_episode_steps=7", "budget.stop_at=null",
]


def test_the_spec_chooses_the_runner_kind() -> None:
    assert set(RUNNER_KINDS) == {"vector", "batched"}
    assert runner_class(load_spec(SPEC, SMALL)) is BatchedRunner
    assert runner_class(load_spec(SPEC.parent / "sac.yaml")) is EnvRunner
    for kind in RUNNER_KINDS.values():  # every kind answers the whole contract
        missing = [name for name in Runner.__dict__ if not name.startswith("_") and not hasattr(kind, name)]
        assert not missing, (kind, missing)


def test_a_chunk_holds_every_real_step_with_the_final_observation_where_an_episode_ended() -> None:
    runner = BatchedRunner(load_spec(SPEC, SMALL), index=0)
    transitions, stats = runner.sample(10, random_actions=True)
    assert transitions.rows == stats.env_steps == 10 * 16  # PointReach resets in the step: no row is lost
    assert transitions.obs.dtype == np.float32 and transitions.obs.shape == (160, runner.obs_dims.full)
    assert np.all(np.abs(transitions.action) <= 1)  # replay keeps the policy's [-1, 1] actions
    # episodes of 7 steps: every copy ended once (at its 7th step), truncated, and its next_obs is the
    # final one, never the fresh start the env reset to
    ended = transitions.truncated.reshape(10, 16)
    assert ended[6].all() and ended.sum() == 16
    assert len(stats.episodes) == 16 and all(e.length == 7 for e in stats.episodes)
    assert all({"distance", "is_success"} <= set(e.info) for e in stats.episodes)
    start_of_next = transitions.obs.reshape(10, 16, -1)[7]
    assert not np.allclose(transitions.next_obs.reshape(10, 16, -1)[6], start_of_next)
    count, mean, var = stats.moments.obs
    assert count == 160 and mean.shape == (runner.obs_dims.full,)
    np.testing.assert_allclose(mean, transitions.obs.astype(np.float64).mean(0), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tensor_n_step_windows_give_the_host_windows_transitions(seed: int) -> None:
    """The same steps, with episode ends among them, through both: the same multiset of transitions."""
    rng, n_step, gamma, envs, steps = np.random.default_rng(seed), 3, 0.9, 4, 40
    host, tensor = NStepWindow(envs, n_step, gamma), TensorNStep(n_step, gamma)
    from_host, from_tensor = [], []
    for t in range(steps):
        obs, next_obs = rng.normal(size=(envs, 2)).astype(np.float32), rng.normal(size=(envs, 2)).astype(np.float32)
        action, reward = rng.normal(size=(envs, 1)).astype(np.float32), rng.normal(size=envs).astype(np.float32)
        terminated, truncated = rng.random(envs) < 0.1, rng.random(envs) < 0.1
        for i in range(envs):
            from_host += host.push(i, obs[i], action[i], float(reward[i]), next_obs[i], bool(terminated[i]),
                                   bool(truncated[i]))
        row = {"obs": torch.from_numpy(obs), "action": torch.from_numpy(action), "reward": torch.from_numpy(reward),
               "next_obs": torch.from_numpy(next_obs), "terminated": torch.from_numpy(terminated),
               "truncated": torch.from_numpy(truncated), "valid": torch.ones(envs, dtype=torch.bool)}
        out = tensor.push(row)
        if out is not None and t < steps - 1 - n_step:  # the host windows still hold the last steps' starts
            from_tensor += [tuple(out[k][i].numpy().tobytes() if out[k][i].dim() else float(out[k][i])
                                  for k in ("obs", "reward", "next_obs", "terminated", "truncated", "discount"))
                            for i in range(envs)]
    host_rows = {(o.tobytes(), r, n.tobytes(), te, tr, d) for o, _, r, n, te, tr, d in from_host}
    tensor_rows = {(o, r, n, float(te), float(tr), d) for o, r, n, te, tr, d in from_tensor}
    assert tensor_rows and len(tensor_rows) == len(from_tensor)
    missing = [row for row in tensor_rows if not any(
        row[0] == h[0] and row[2] == h[2] and row[3:5] == h[3:5] and np.isclose(row[1], h[1], rtol=1e-5, atol=1e-5)
        and np.isclose(row[5], h[5]) for h in host_rows)]
    assert not missing, missing[:2]


def test_the_runner_state_repeats_the_next_chunk_exactly() -> None:
    spec = load_spec(SPEC, [*SMALL, "algo.n_step=3"])
    runner = BatchedRunner(spec, index=0)
    runner.sample(5, random_actions=False)
    state = runner.state()
    assert state["env_restarts"] is False  # PointReach gives its whole state
    expected, _ = runner.sample(6, random_actions=False)
    restored = BatchedRunner(spec, index=0)
    restored.set_weights(runner.policy.state_dict(), version=0)  # as the graph gives every runner the learner's
    restored.load_state(state)
    again, _ = restored.sample(6, random_actions=False)
    for name, column in expected._asdict().items():
        np.testing.assert_array_equal(column, getattr(again, name), err_msg=name)


def test_a_resumed_batched_run_repeats_the_uninterrupted_one(tmp_path: Path) -> None:
    spec = load_spec(SPEC, SMALL)
    whole = Trainer(spec, run_dir=tmp_path / "whole", live=False).run()
    (midway,) = [p for p in (tmp_path / "whole" / "checkpoints").glob("step_*") if "160" in p.name]
    resumed = Trainer(spec, run_dir=tmp_path / "resumed", resume=load_checkpoint(midway), live=False).run()
    assert whole.evals[-1] == resumed.evals[-1]
    a, b = (load_checkpoint(run.checkpoint).learner.algo for run in (whole, resumed))
    flat_a = torch.cat([t.reshape(-1).float() for t in _tensors(a)])
    assert torch.equal(flat_a, torch.cat([t.reshape(-1).float() for t in _tensors(b)]))


def test_the_ray_backend_repeats_the_inline_run(tmp_path: Path) -> None:
    runs = {backend: Trainer(load_spec(SPEC, [*SMALL, f"runtime.backend={backend}"]), run_dir=tmp_path / backend,
                             live=False).run() for backend in ("inline", "ray")}
    assert runs["inline"].evals == runs["ray"].evals and len(runs["inline"].evals) >= 2
    assert runs["inline"].env_steps == runs["ray"].env_steps


def _tensors(tree: object) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for key in sorted(tree, key=str) for t in _tensors(tree[key])]
    if isinstance(tree, list | tuple):
        return [t for item in tree for t in _tensors(item)]
    return []


@pytest.mark.learning
def test_sac_learns_point_reach_through_the_batched_runner() -> None:
    """64 copies stepped in one call: the final distance to the target falls from about 1.1 (a random
    policy's) under 0.15 within 48k env steps (seeds 0-2 reached it at 25k-37k, in 14-24 s)."""
    from learning_runs import train

    result = train(
        "sac_point_reach.yaml", "runners.envs_per_runner=64", "algo.actor_hidden_dims=[64,64]",
        "algo.critic_hidden_dims=[64,64]", "algo.batch_size=256", "algo.train_every=2", "algo.utd_ratio=8",
        "algo.warm_up_steps=1024", "budget.env_steps=48000", "eval.every_env_steps=4096", "eval.episodes=32",
        "budget.stop_at={metric: eval/distance, below: 0.15}",
    )
    distances = [evaluation["eval/distance"] for evaluation in result.evals]
    assert distances[0] > 0.5 and min(distances) < 0.15, distances


def test_envpool_halfcheetah_through_the_batched_runner() -> None:
    """EnvPool resets a finished copy on the next call: that row is no transition and is not stored."""
    pytest.importorskip("envpool", reason="EnvPool is an optional extra: pip install -e '.[envpool]'")
    spec = load_spec(SPEC.parent / "sac.yaml", [
        "env.id=HalfCheetah-v5", "env.batched=envpool", "env.max_episode_steps=5", "runners.envs_per_runner=4",
        "algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]",
    ])
    runner = runner_class(spec)(spec, index=0)
    assert runner.env_dims() == ((17, 17, ()), 6)
    transitions, stats = runner.sample(12, random_actions=False)
    # 12 calls of 5-step episodes: the 6th and 12th call of each copy are resets, not stored
    assert stats.env_steps == transitions.rows == 4 * 10
    assert transitions.truncated.sum() == 4 * 2 and len(stats.episodes) == 8
    assert all(episode.length == 5 for episode in stats.episodes)
    assert runner.state()["env_restarts"] is True  # EnvPool gives no state: a resume starts episodes afresh


def test_a_batched_runs_policy_loads_evaluates_and_exports_without_a_trust_flag(tmp_path: Path) -> None:
    """aa-ray's own batched env is installed code: its checkpoint needs no --trust-code (a user's
    module would), and evaluation and export work from the batched env's action bounds."""
    from aa_ray.api import load_policy
    from aa_ray.spec.trust import named_code

    assert named_code({"env": {"entry_point": "aa_ray.envs.point_reach:PointReach"}}) == []
    assert named_code({"env": {"entry_point": "mypkg.envs:PointReach"}})  # a user's module still counts
    result = Trainer(load_spec(SPEC, [*SMALL, "budget.env_steps=192"]), run_dir=tmp_path / "run", live=False).run()
    policy = load_policy(result.checkpoint)
    evaluation = policy.evaluate(episodes=4)
    assert evaluation["eval/length"] == 7 and "eval/distance" in evaluation
    assert policy.predict(np.zeros(policy.obs_dim, np.float32)).shape == (2,)
    assert policy.export(tmp_path / "policy.pt", "torchscript").is_file()
