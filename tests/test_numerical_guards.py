"""Numerical guards: a gradient step whose loss or gradients are not finite is skipped and counted
(the weights stay finite), and a run whose updates keep coming out non-finite stops cleanly,
naming the checkpoint to resume from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from aa_ray.records import Transitions
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.learner import Learner
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
MYENVS = Path(__file__).resolve().parent / "user_envs" / "myenvs"


def batches(rng: np.random.Generator, poisoned: bool) -> Transitions:
    shape = (2, 32)  # train_every x utd = 2 critic steps of 32 rows
    reward = rng.normal(size=shape).astype(np.float32)
    if poisoned:
        reward[:, 3] = np.nan  # one bad row poisons the whole TD loss
    return Transitions(
        obs=rng.normal(size=(*shape, 3)).astype(np.float32),
        action=rng.uniform(-1, 1, (*shape, 1)).astype(np.float32),
        reward=reward, next_obs=rng.normal(size=(*shape, 3)).astype(np.float32),
        terminated=np.zeros(shape, np.float32), truncated=np.zeros(shape, np.float32),
        discount=np.full(shape, 0.99, np.float32),
    )


def critic_vector(learner: Learner) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in learner.algo.agent.critic.parameters()])


def test_a_poisoned_batch_skips_the_critic_steps_and_leaves_the_weights_finite() -> None:
    spec = load_spec(SPECS / "sac_pendulum.yaml", ["algo.actor_hidden_dims=[16]",
        "algo.critic_hidden_dims=[16]", "algo.train_every=2", "algo.batch_size=32"])
    learner = Learner(spec, obs_dim=3, act_dim=1)
    rng = np.random.default_rng(0)
    before = critic_vector(learner)
    info = learner.update([], batches(rng, poisoned=True)).metrics
    assert info["learner/skipped_updates"] == 2 and info["learner/consecutive_skips"] == 2
    assert torch.equal(critic_vector(learner), before)  # no step taken, no Adam moment touched
    assert all(torch.isfinite(p).all() for p in learner.algo.policy.parameters())
    info = learner.update([], batches(rng, poisoned=False)).metrics
    assert info["learner/skipped_updates"] == 2 and info["learner/consecutive_skips"] == 0
    assert not torch.equal(critic_vector(learner), before)


def test_a_run_that_only_produces_nan_stops_cleanly(tmp_path: Path) -> None:
    """Pendulum with gravity NaN (tests/user_envs/myenvs/diverging.py): every observation and reward
    after the first step is NaN. The
    updates are skipped, the run stops past runtime.max_consecutive_skips with a message naming the
    last checkpoint, and that checkpoint's weights are finite."""
    run = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "run", str(SPECS / "sac_pendulum.yaml"), "--no-track", "--plain",
         "--set", "env.entry_point=myenvs.diverging:nan_gravity_pendulum", "--set", f"env.py_modules=[{MYENVS}]",
         "--set", "env.max_episode_steps=200", "--set", "algo.warm_up_steps=200", "--set", "budget.env_steps=3000",
         "--set", "checkpoint.every_env_steps=100", "--set", "runtime.max_consecutive_skips=150",
         "--set", "algo.actor_hidden_dims=[32,32]",
         "--set", "algo.critic_hidden_dims=[32,32]", "--set", "eval.every_env_steps=1000", "--set", "eval.episodes=2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert run.returncode == 1, (run.stdout + run.stderr)[-3000:]
    message = " ".join(run.stderr.split())
    assert "non-finite losses or gradients (runtime.max_consecutive_skips=150)" in message
    assert "Traceback" not in run.stderr
    checkpoint = message.split("--resume ")[1].split()[0].rstrip(";.")
    policy = load_checkpoint(checkpoint).learner.algo["policy"]
    assert all(torch.isfinite(tensor).all() for tensor in policy.values() if tensor.is_floating_point())
