"""The categorical (C51) critic: projection and saturation against hand-computed cases, and the
sac_dist / sac_dist_simba learners (one update, pessimistic target choice, checkpoint round trip)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from aa_ray.nets.distributional import make_support, project_distribution, saturation
from aa_ray.nets.simba import HyperKernel
from aa_ray.records import Batch, CheckpointParts, NormMoments, Transitions
from aa_ray.runtime.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from aa_ray.runtime.learner import Learner
from aa_ray.spec.loader import apply_overrides, validate_spec

# a 5-atom support with unit spacing: z = [-2, -1, 0, 1, 2]
SUPPORT = make_support(5, -2.0, 2.0)
PROBS = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])


def project(reward: float, bootstrap: float, probs: torch.Tensor = PROBS) -> torch.Tensor:
    return project_distribution(probs[None], torch.tensor([reward]), torch.tensor([bootstrap]), SUPPORT)[0]


def test_support_atoms() -> None:
    torch.testing.assert_close(SUPPORT, torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0]))
    assert make_support(101, -5.0, 5.0)[50] == 0.0
    with pytest.raises(ValueError, match="v_min < v_max"):
        make_support(5, 1.0, -1.0)


def test_atoms_landing_exactly_on_atoms_keep_all_their_mass() -> None:
    # r + z = [-1, 0, 1, 2, 3]: every shifted atom sits on a support atom (floor == ceil), and the
    # last one is clipped onto v_max = 2 -- all of it must arrive, nothing may vanish
    target = project(reward=1.0, bootstrap=1.0)
    torch.testing.assert_close(target, torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4]))
    assert target.sum().item() == pytest.approx(1.0)


def test_fractional_atoms_split_between_neighbours() -> None:
    # 0.5 + 0.5 z = [-0.5, 0, 0.5, 1, 1.5]:
    # 0.1 -> half to -1, half to 0; 0.2 -> 0; 0.3 -> half to 0, half to 1; 0.25 -> 1; 0.15 -> half to 1, half to 2
    target = project(reward=0.5, bootstrap=0.5)
    torch.testing.assert_close(target, torch.tensor([0.0, 0.05, 0.4, 0.475, 0.075]))
    # the projection keeps the mean when nothing is clipped: E = 0.5 + 0.5 E[Z']
    assert (target * SUPPORT).sum().item() == pytest.approx(0.5 + 0.5 * (PROBS * SUPPORT).sum().item())


def test_clipping_at_both_ends() -> None:
    # -3 + 0.9 z = [-4.8, -3.9, -3.0, -2.1, -1.2]: four atoms clip to v_min = -2 (0.85 of the mass);
    # -1.2 sits 0.8 of the way from -2 to -1, so 0.2 * 0.15 goes to -2 and 0.8 * 0.15 to -1
    torch.testing.assert_close(project(reward=-3.0, bootstrap=0.9), torch.tensor([0.88, 0.12, 0.0, 0.0, 0.0]))
    # 2.5 + 0.5 z = [1.5, 2, 2.5, 3, 3.5]: 0.1 splits between 1 and 2, everything else clips to v_max
    torch.testing.assert_close(project(reward=2.5, bootstrap=0.5), torch.tensor([0.0, 0.0, 0.0, 0.05, 0.95]))


def test_terminal_puts_all_mass_at_the_reward() -> None:
    # bootstrap = 0: the return is r whatever Z' was
    torch.testing.assert_close(project(reward=1.0, bootstrap=0.0), torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0]))
    # -0.25 is a quarter of the way from 0 down to -1: 0.25 to -1, 0.75 to 0
    torch.testing.assert_close(project(reward=-0.25, bootstrap=0.0), torch.tensor([0.0, 0.25, 0.75, 0.0, 0.0]))
    torch.testing.assert_close(project(reward=7.0, bootstrap=0.0), torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]))


def test_projection_keeps_mass_on_a_random_batch() -> None:
    torch.manual_seed(0)
    support = make_support(51, -10.0, 10.0)
    probs = torch.softmax(torch.randn(512, 51), dim=-1)
    # integer rewards with bootstrap 1 put every atom exactly on an atom (the floor == ceil case)
    reward = torch.cat([torch.randn(256) * 5, torch.randint(-3, 4, (256,)).float() * 0.4])
    bootstrap = torch.cat([torch.rand(256), torch.ones(256)])
    target = project_distribution(probs, reward, bootstrap, support)
    assert (target >= 0).all()
    torch.testing.assert_close(target.sum(-1), torch.ones(512))


def test_saturation_is_the_clipped_share() -> None:
    # [-1, 0, 1, 2, 3]: only the atom at 3 (mass 0.15) is clipped; the one landing exactly on 2 is not
    low, high = saturation(PROBS[None], torch.tensor([1.0]), torch.tensor([1.0]), SUPPORT)
    assert (low.item(), high.item()) == (0.0, pytest.approx(0.15))
    # [-4.8, -3.9, -3.0, -2.1, -1.2]: 0.85 below v_min; batch-averaged with an unclipped sample
    low, high = saturation(PROBS.expand(2, 5), torch.tensor([-3.0, 0.0]), torch.tensor([0.9, 0.5]), SUPPORT)
    assert (low.item(), high.item()) == (pytest.approx(0.85 / 2), 0.0)


# --- the learners -------------------------------------------------------------------------------

OBS_DIM, ACT_DIM = 3, 1


def small_spec(algo: str, **extra: str):
    nets = (
        {"actor_hidden_dims": [16, 16], "critic_hidden_dims": [16, 16]}
        if algo == "sac_dist"
        else {"critic_hidden_dim": 16, "critic_num_blocks": 1, "actor_hidden_dim": 8}
    )
    raw = {
        "name": "dist_unit",
        "env": {"id": "Pendulum-v1"},
        "algo": {"name": algo, "num_atoms": 11, "batch_size": 8, "utd_ratio": 2, "warm_up_steps": 10, **nets},
        "budget": {"env_steps": 1000},
    }
    return validate_spec(apply_overrides(raw, [f"{k}={v}" for k, v in extra.items()]))


def random_samples(num_batches: int, batch_size: int, seed: int = 0) -> Transitions:
    rng = np.random.default_rng(seed)
    shape = (num_batches, batch_size)
    terminated = (rng.random(shape) < 0.2).astype(np.float32)
    return Transitions(
        obs=rng.normal(size=(*shape, OBS_DIM)).astype(np.float32),
        action=rng.uniform(-1, 1, size=(*shape, ACT_DIM)).astype(np.float32),
        reward=rng.normal(size=shape).astype(np.float32),
        next_obs=rng.normal(size=(*shape, OBS_DIM)).astype(np.float32),
        terminated=terminated, truncated=np.zeros_like(terminated),
        discount=np.full(shape, 0.99, np.float32),
    )


NORM_STATS = [NormMoments((5, np.zeros(OBS_DIM), np.ones(OBS_DIM)), (5, -1.0, 2.0, 3.0))]


@pytest.mark.parametrize("algo", ["sac_dist", "sac_dist_simba"])
def test_update_reports_diagnostics(algo: str) -> None:
    learner = Learner(small_spec(algo), OBS_DIM, ACT_DIM)
    critic_before = [p.detach().clone() for p in learner.algo.agent.critic.parameters()]
    info = learner.update(NORM_STATS, random_samples(4, 8)).metrics
    for key in ("critic/q_loss", "critic/q_value", "critic/td_target", "critic/support_saturation_low",
                "critic/support_saturation_high", "actor/alpha", "actor/loss"):
        assert np.isfinite(info[key]), key
    # cross-entropy against a distribution on 11 atoms: positive, at most log(11) + a bit at the start
    assert 0 < info["critic/q_loss"] < 2 * np.log(11)
    critic_after = learner.algo.agent.critic.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, critic_after, strict=True))
    if algo == "sac_dist_simba":  # hyperspherical kernels are back on the unit sphere after the steps
        assert info["critic/reward_scale"] != 1.0  # reward scaling is on by default here
        for module in [*learner.algo.agent.critic.modules(), *learner.algo.policy.actor.modules()]:
            if isinstance(module, HyperKernel):
                norms = module.weight.square().sum(dim=module.kernel_norm_dim).sqrt()
                torch.testing.assert_close(norms, torch.ones_like(norms))


class FixedLogits(nn.Module):
    """A stand-in target critic: member 0 is sure the return is +2 for sample 0 and -2 for
    sample 1; member 1 the other way round."""

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        logits = torch.full((2, 2, 5), -1e4)
        logits[0, 0, 4] = logits[0, 1, 0] = logits[1, 0, 0] = logits[1, 1, 4] = 0.0
        return logits


@pytest.mark.parametrize("algo", ["sac_dist", "sac_dist_simba"])
def test_target_projects_the_pessimistic_critic_per_sample(algo: str) -> None:
    spec = small_spec(algo, **{"algo.num_atoms": 5, "algo.v_min": -2, "algo.v_max": 2, "algo.normalize_reward": False,
                               "algo.init_alpha": 1e-12, "algo.utd_ratio": 1})
    algo_obj = Learner(spec, OBS_DIM, ACT_DIM).algo
    algo_obj.agent.critic_target.forward = FixedLogits().forward  # keeps the parameters the polyak step moves
    samples = random_samples(1, 2)
    samples.reward[:] = 0.5
    samples.terminated[:] = 0.0
    samples.discount[:] = 0.5
    info = algo_obj.update(Batch.from_transitions(samples, torch.device("cpu")))  # one critic step, then the actor
    # both samples take the -2 critic: target 0.5 + 0.5 * (-2) = -0.5 each (an optimist would give +1.5)
    assert float(info["critic/td_target"]) == pytest.approx(-0.5, abs=1e-6)


@pytest.mark.parametrize("algo", ["sac_dist", "sac_dist_simba"])
def test_checkpoint_round_trip_restores_parameters(tmp_path: Path, algo: str) -> None:
    spec = small_spec(algo)
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    learner.update(NORM_STATS, random_samples(4, 8))

    save_checkpoint(tmp_path / "ckpt", spec, CheckpointParts(learner=learner.state_dict()))
    payload = load_checkpoint(tmp_path / "ckpt")
    check_compatible(spec, payload)
    restored = Learner(spec, OBS_DIM, ACT_DIM)
    restored.load_state_dict(payload.learner)

    for name in ("policy", "critic", "critic_target", "reward_norm"):
        saved, loaded = getattr(learner.algo.agent, name).state_dict(), getattr(restored.algo.agent, name).state_dict()
        assert saved.keys() == loaded.keys()
        for key in saved:
            assert torch.equal(saved[key], loaded[key]), f"{name}.{key}"
    assert torch.equal(learner.algo.agent.log_alpha, restored.algo.agent.log_alpha)
    # the same next update from both gives the same numbers (optimizer moments restored too)
    samples = random_samples(2, 8, seed=1)
    torch.manual_seed(0)
    a = learner.update([], samples).metrics
    torch.manual_seed(0)
    b = restored.update([], samples).metrics
    assert a["critic/q_loss"] == b["critic/q_loss"] and a["actor/loss"] == b["actor/loss"]


def test_config_refuses_inconsistent_supports() -> None:
    with pytest.raises(ValueError, match="v_min must be below v_max"):
        small_spec("sac_dist", **{"algo.v_min": 1, "algo.v_max": -1})
    with pytest.raises(ValueError, match="needs v_min < 0 < v_max"):
        small_spec("sac_dist_simba", **{"algo.v_min": -10, "algo.v_max": 0})
    with pytest.raises(ValueError, match="cross-entropy"):
        small_spec("sac_dist", **{"algo.critic_loss": "huber"})
