"""TD3's math and plumbing, in-process: target smoothing, delayed updates, exploration noise,
the bootstrap mask, and a Learner checkpoint round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.td3 import TD3, TD3Config, make_policy, smoothed_target_action
from aa_ray.records import Batch, CheckpointParts, NormMoments, ObsDims
from aa_ray.runtime.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import apply_overrides, validate_spec

OBS_DIM, ACT_DIM = 3, 2


def small_td3(**knobs) -> TD3:
    torch.manual_seed(0)
    cfg = TD3Config(actor_hidden_dims=[16], critic_hidden_dims=[16], batch_size=8, **knobs)
    return TD3(cfg, ObsDims.of(OBS_DIM), ACT_DIM, TrainingSetup.on_cpu())


def random_batch(num_batches: int, batch_size: int = 8, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    shape = (num_batches, batch_size)
    return Batch(
        obs=torch.randn(*shape, OBS_DIM, generator=g),
        action=torch.rand(*shape, ACT_DIM, generator=g) * 2 - 1,
        reward=torch.randn(*shape, generator=g),
        next_obs=torch.randn(*shape, OBS_DIM, generator=g),
        terminated=torch.zeros(shape),
        discount=torch.full(shape, 0.99),
    )


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def changed(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_smoothing_noise_is_clipped_and_target_action_stays_in_the_box() -> None:
    """a' = clip(mu'(s') + clip(eps, -0.5, 0.5), -1, 1), by hand."""
    next_action = torch.tensor([[0.9, -0.2, 0.0], [-0.95, 0.1, 0.3]])
    noise = torch.tensor([[0.3, -0.7, 0.6], [-0.1, 0.2, -0.4]])
    expected = torch.tensor([[1.0, -0.7, 0.5], [-1.0, 0.3, -0.1]])
    torch.testing.assert_close(smoothed_target_action(next_action, noise, noise_clip=0.5), expected)
    # the clip is symmetric and a zero clip leaves the target actor's action unchanged
    torch.testing.assert_close(smoothed_target_action(next_action, noise, noise_clip=0.0), next_action)


def test_bootstrap_is_masked_only_by_a_terminal_and_uses_the_smaller_target_critic() -> None:
    """Without smoothing noise, y = r + gamma (1 - terminated) min_i Q'_i(s', tanh(mu'(s')))."""
    algo = small_td3(target_noise=0.0)
    b = random_batch(1).at(0)
    with torch.no_grad():
        next_action = torch.tanh(algo.agent.actor_target(b.next_obs))
        min_q = algo.agent.critic_target(b.next_obs, next_action).min(dim=0).values
    expected = (b.reward + 0.99 * min_q).mean().item()
    assert float(algo.critic_update(b)["critic/td_target"]) == pytest.approx(expected, rel=1e-5)
    terminal = Batch(b.obs, b.action, b.reward, b.next_obs, torch.ones_like(b.terminated), b.discount)
    assert float(algo.critic_update(terminal)["critic/td_target"]) == pytest.approx(b.reward.mean().item())


def test_actor_and_targets_update_only_every_policy_delay_critic_steps() -> None:
    """policy_delay 3, over calls of 1, 2 and 4 stacked batches (7 critic steps): the actor and both
    targets move after critic steps 3 and 6 only; the critics move on every step."""
    algo = small_td3(policy_delay=3)
    batches = random_batch(7)
    moved, critic_moved = [], []
    start = 0
    for size in (1, 2, 4):
        for i in range(start, start + size):  # step one stacked batch at a time to see each critic step
            actor, actor_target = snapshot(algo.policy.actor), snapshot(algo.agent.actor_target)
            critic, critic_target = snapshot(algo.agent.critic), snapshot(algo.agent.critic_target)
            algo.update(Batch(*(t[i : i + 1] for t in batches)))
            moves = (changed(actor, algo.policy.actor), changed(actor_target, algo.agent.actor_target))
            assert moves[0] == moves[1] == changed(critic_target, algo.agent.critic_target)
            moved.append(moves[0])
            critic_moved.append(changed(critic, algo.agent.critic))
        start += size
    assert moved == [False, False, True, False, False, True, False]
    assert all(critic_moved) and algo.critic_updates == 7

    # the same schedule when the steps come stacked (utd_ratio > 1): 7 more critic steps -> actor on 9 and 12
    actor_steps_before = _optimizer_steps(algo.agent.actor_step.optimizer)
    algo.update(random_batch(7, seed=1))
    assert _optimizer_steps(algo.agent.actor_step.optimizer) - actor_steps_before == 2
    assert _optimizer_steps(algo.agent.critic_step.optimizer) == 14


def _optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    states = list(optimizer.state.values())
    return int(states[0]["step"]) if states else 0


def test_diagnostics_report_the_last_critic_and_actor_steps() -> None:
    algo = small_td3()
    info = {key: float(value) for key, value in algo.update(random_batch(2)).items()}
    for key in ("critic/q_loss", "critic/q_value", "critic/grad_norm", "actor/loss", "actor/grad_norm"):
        assert np.isfinite(info[key]), key
    assert 0.0 <= info["critic/target_noise_clip_fraction"] <= 1.0
    # 0.2-std noise clipped at 0.5: P(|eps| > 2.5 sigma) is about 1.2%
    assert info["critic/target_noise_clip_fraction"] < 0.1
    assert algo.update(random_batch(1)).keys().isdisjoint({"actor/loss"})  # step 3: no actor


def test_exploration_noise_only_when_not_deterministic() -> None:
    torch.manual_seed(0)
    policy = make_policy(TD3Config(actor_hidden_dims=[16],
        critic_hidden_dims=[16], exploration_noise=0.1), ObsDims.of(OBS_DIM), ACT_DIM)
    obs = np.random.default_rng(0).normal(size=(4000, OBS_DIM)).astype(np.float32)
    greedy = policy.act(obs, deterministic=True)
    np.testing.assert_array_equal(greedy, policy.act(obs, deterministic=True))
    np.testing.assert_allclose(greedy, policy(torch.as_tensor(obs)).detach().numpy())

    noisy = policy.act(obs, deterministic=False, generator=torch.Generator().manual_seed(1))
    again = policy.act(obs, deterministic=False, generator=torch.Generator().manual_seed(1))
    np.testing.assert_array_equal(noisy, again)  # drawn from the generator it is given
    inside = np.abs(greedy) < 0.6  # away from the box edges the noise is never clipped
    assert abs(float((noisy - greedy)[inside].std()) - 0.1) < 0.01
    assert abs(float((noisy - greedy)[inside].mean())) < 0.01

    loud = make_policy(TD3Config(actor_hidden_dims=[16],
        critic_hidden_dims=[16], exploration_noise=5.0), ObsDims.of(OBS_DIM), ACT_DIM)
    actions = loud.act(obs, deterministic=False, generator=torch.Generator().manual_seed(2))
    assert actions.min() == -1.0 and actions.max() == 1.0  # clipped to the box, and it does get there
    silent = make_policy(TD3Config(actor_hidden_dims=[16],
        critic_hidden_dims=[16], exploration_noise=0.0), ObsDims.of(OBS_DIM), ACT_DIM)
    np.testing.assert_array_equal(silent.act(obs, deterministic=False), silent.act(obs, deterministic=True))


def pendulum_spec(**extra: str):
    raw = {
        "name": "td3_units",
        "env": {"id": "Pendulum-v1", "max_episode_steps": 10},
        "algo": {"name": "td3", "warm_up_steps": 10, "batch_size": 8, "buffer_size": 100, "actor_hidden_dims": [16],
        "critic_hidden_dims": [16]},
        "budget": {"env_steps": 1000},
        "runners": {"envs_per_runner": 2},
    }
    return validate_spec(apply_overrides(raw, [f"{k}={v}" for k, v in extra.items()]))


def test_learner_checkpoint_round_trip_restores_parameters_and_the_delay_phase(tmp_path: Path) -> None:
    """3 critic steps (odd: mid-delay), save, restore: every part, the optimizer state and the
    critic-step counter come back, so the next update steps the actor in both learners alike."""
    spec = pendulum_spec(**{"algo.normalize_obs": "true", "algo.normalize_reward": "true"})
    learner = Learner(spec, obs_dim=3, act_dim=1)
    runner = EnvRunner(spec, 0)
    replay = ReplayBuffer(100, 3, 1, seed=0)
    replay.add(runner.sample(10, random_actions=False)[0])  # acting with the TD3 policy
    stats = [NormMoments((5, np.ones(3), np.full(3, 2.0)), (5, 1.0, 2.0, 3.0))]
    learner.update(stats, replay.sample(3, 8))
    assert learner.algo.critic_updates == 3

    save_checkpoint(tmp_path / "ckpt", spec, CheckpointParts(learner=learner.state_dict()))
    payload = load_checkpoint(tmp_path / "ckpt")
    check_compatible(spec, payload)
    restored = Learner(spec, obs_dim=3, act_dim=1)
    restored.load_state_dict(payload.learner)

    assert restored.algo.critic_updates == 3
    for name in ("policy", "actor_target", "critic", "critic_target", "reward_norm"):
        saved, loaded = getattr(learner.algo.agent, name).state_dict(), getattr(restored.algo.agent, name).state_dict()
        assert saved.keys() == loaded.keys()
        for key in saved:
            assert torch.equal(saved[key], loaded[key]), f"{name}.{key}"
    for name in ("actor_step", "critic_step"):
        saved = getattr(learner.algo.agent, name).optimizer.state_dict()["state"]
        loaded = getattr(restored.algo.agent, name).optimizer.state_dict()["state"]
        assert saved.keys() == loaded.keys() and saved
        for key, slot in saved.items():
            for field, value in slot.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(loaded[key][field])), (name, field)

    batches = replay.sample(1, 8)
    torch.manual_seed(0)  # the same smoothing noise for both
    a = learner.update([], batches).metrics
    torch.manual_seed(0)
    b = restored.update([], batches).metrics
    assert "actor/loss" in a  # critic step 4: the delayed actor step
    assert a["critic/q_loss"] == b["critic/q_loss"] and a["actor/loss"] == b["actor/loss"]
