"""CrossQ and DroQ as the runtime runs them: networks in training mode only where the learner
trains them, batch renormalization's statistics travelling with the policy's weights and the
checkpoints, DroQ's dropout on in every critic forward of the update. (Their learning:
tests/test_learning_crossq_droq.py; two DDP learners' statistics: tests/test_scale_out.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aa_ray.errors import SpecError
from aa_ray.nets.batch_renorm import BatchRenorm, RenormSettings
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = ["tracking.enabled=false", "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]",
         "algo.batch_size=32", "algo.warm_up_steps=10", "runners.envs_per_runner=4"]


def trained(spec_file: str, *overrides: str) -> tuple[EnvRunner, Learner]:
    """A runner and a learner after a few updates on the runner's data; the runner holds the weights."""
    spec = load_spec(SPECS / spec_file, [*SMALL, *overrides])
    runner, learner = EnvRunner(spec, 0), Learner(spec, 10, 2)
    replay = ReplayBuffer(1000, 10, 2, seed=0)
    replay.add(runner.sample(25, random_actions=True)[0])
    for _ in range(3):
        learner.update([], replay.sample(spec.algo.updates_per_iteration, 32))
    runner.set_weights(*learner.policy_state())
    return runner, learner


def test_runners_act_with_the_learners_running_statistics_in_eval_mode() -> None:
    """The runner's CrossQ policy is in evaluation mode: it normalizes by the running statistics the
    learner's training-mode updates moved, so an observation's action does not depend on the rest of
    the batch; in training mode (batch statistics) it would."""
    runner, learner = trained("crossq.yaml", "algo.renorm_warmup_steps=5")
    assert not any(module.training for module in runner.policy.modules())
    assert all(module.training for module in learner.algo.policy.modules())
    layers = [m for m in runner.policy.modules() if isinstance(m, BatchRenorm)]
    learned = [m for m in learner.algo.policy.modules() if isinstance(m, BatchRenorm)]
    assert len(layers) == 3 and all(int(m.steps) > 0 for m in learned)
    for mine, theirs in zip(layers, learned, strict=True):
        assert torch.equal(mine.running_mean, theirs.running_mean) and torch.equal(mine.running_var, theirs.running_var)
    obs = runner.obs
    alone = runner.policy.act(obs[:1], deterministic=True)
    np.testing.assert_allclose(runner.policy.act(obs, deterministic=True)[:1], alone, rtol=1e-5, atol=1e-6)
    runner.policy.train()  # what acting in training mode would do
    assert not np.allclose(runner.policy.act(obs, deterministic=True)[:1], alone, atol=1e-3)


def test_crossq_checkpoints_its_statistics_and_has_no_target_networks() -> None:
    _, learner = trained("crossq.yaml")
    parts = learner.algo.parts()
    assert "critic_target" not in parts and "actor_target" not in parts
    state = learner.state_dict().algo
    restored = Learner(load_spec(SPECS / "crossq.yaml", SMALL), 10, 2)
    restored.load_state_dict(learner.state_dict())
    for net in ("policy", "critic"):
        stats = {key: value for key, value in state[net].items() if "running_" in key or key.endswith("steps")}
        assert len(stats) == 9  # (mean, var, steps) of 3 layers
        loaded = getattr(restored.algo.agent, net).state_dict()
        assert all(torch.equal(loaded[key], value) for key, value in stats.items())


def test_crossq_trains_under_bf16_autocast_and_keeps_its_running_statistics_fp32() -> None:
    """specs/mujoco/fast_cpu.yaml's precision: the layers run in bf16, the statistics they average stay fp32."""
    runner, learner = trained("crossq.yaml", "algo.precision=bf16", "algo.renorm_warmup_steps=5")
    nets = (learner.algo.policy, learner.algo.agent.critic)
    layers = [m for net in nets for m in net.modules() if isinstance(m, BatchRenorm)]
    assert len(layers) == 6 and all(int(m.steps) > 0 for m in layers)
    assert all(m.running_mean.dtype == m.running_var.dtype == torch.float32 for m in layers)
    replay = ReplayBuffer(1000, 10, 2, seed=0)
    replay.add(runner.sample(25, random_actions=True)[0])
    metrics = learner.update([], replay.sample(3, 32)).metrics  # an actor step every 3rd critic step
    assert np.isfinite(metrics["critic/q_loss"]) and np.isfinite(metrics["actor/loss"])


def test_crossq_refuses_a_polyak_rate() -> None:
    with pytest.raises(SpecError, match="algo.tau: CrossQ has no target networks"):
        load_spec(SPECS / "crossq.yaml", ["algo.tau=0.01"])


def test_batch_renorm_is_batch_norm_until_warmed_up_then_corrects_toward_running_statistics() -> None:
    torch.manual_seed(0)
    layer = BatchRenorm(3, RenormSettings(momentum=0.5, warmup_steps=1, r_max=1.5, d_max=0.5))
    x = torch.randn(64, 3) * 4 + 2
    first = layer(x)  # warm-up: plain batch normalization
    torch.testing.assert_close(first.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(layer.running_mean, 0.5 * x.mean(0))
    second = layer(x)  # the running statistics lag the batch's: r and d pull toward them, within their clips
    assert not torch.allclose(second, first, atol=1e-3)
    shift = (second - first).mean(0)
    assert (shift.abs() <= 0.5 + 1e-5).all() and (shift.abs() > 0.1).all()
    layer.eval()
    torch.testing.assert_close(layer(x), (x - layer.running_mean) / torch.sqrt(layer.running_var + 1e-3))


def test_droq_critics_drop_units_in_every_training_forward_and_never_in_eval() -> None:
    _, learner = trained("droq.yaml", "algo.utd_ratio=2", "algo.dropout_rate=0.2")
    algo = learner.algo
    obs, action = torch.randn(16, 10), torch.rand(16, 2) * 2 - 1
    for critic in (algo.agent.critic, algo.agent.critic_target):
        assert critic.training and not torch.equal(critic(obs, action), critic(obs, action))
        critic.eval()
        assert torch.equal(critic(obs, action), critic(obs, action))
