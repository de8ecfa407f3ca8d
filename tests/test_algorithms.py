"""Every registered algorithm against the contract in `aa_ray.algos.contract`, in-process: it builds,
`update` returns tensors, `health()` counts, a checkpoint round-trips into a fresh instance that
then learns exactly alike; every off-policy one logs RLPD's diagnostics from the right rows; the
learning-rate schedule reaches every optimizer; and old (pre-redesign) knobs and checkpoints
still load."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from aa_ray.algos.contexts import evaluating
from aa_ray.algos.contract import Health, TrainingSetup, diagnostics_to_floats
from aa_ray.algos.crossq import CrossQ
from aa_ray.algos.losses import sac_actor_loss
from aa_ray.algos.registry import ALGORITHMS, build_algorithm, migrate_old_knobs
from aa_ray.metric_names import ACTOR_LOSS, CRITIC_PRIOR_ONLINE_Q_GAP, CRITIC_PRIOR_Q, RLPD_DIAGNOSTICS
from aa_ray.nets.distributional import expected_value
from aa_ray.records import Batch, Rollout
from aa_ray.spec.loader import validate_spec

OBS_DIM, ACT_DIM, BATCH = 3, 2, 8
FIXTURES = Path(__file__).parent / "fixtures" / "format2"
CPU = torch.device("cpu")
SMALL = {  # small networks and every normalizer on, so merge_stats has something to merge
    "sac": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "learn_v": True, "bee_lambda": 0.5},
    "sac_simba": {"actor_hidden_dim": 16, "critic_hidden_dim": 16, "critic_num_blocks": 1, "learn_v": True,
                  "bee_lambda": 0.5},
    "sac_dist": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "num_atoms": 11, "layer_norm": True},
    "sac_dist_simba": {"actor_hidden_dim": 16, "critic_hidden_dim": 16, "critic_num_blocks": 1, "num_atoms": 11},
    "td3": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "policy_delay": 1},
    "ppo": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "ppo_epochs": 2, "num_minibatches": 2},
    "crossq": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "policy_delay": 1, "renorm_warmup_steps": 1},
    "droq": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "utd_ratio": 2},
    "fast_td3": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "num_atoms": 11, "policy_delay": 1},
    "fast_sac": {"actor_hidden_dims": [16], "critic_hidden_dims": [16], "num_atoms": 11, "policy_delay": 1},
}
OFF_POLICY = [name for name, entry in ALGORITHMS.items() if entry.config.family == "off_policy"]


def config(name: str, **extra):
    knobs = {**SMALL[name], **extra}
    if name in OFF_POLICY:
        knobs |= {"batch_size": BATCH, "normalize_obs": True, "normalize_reward": True}
    return ALGORITHMS[name].config(**knobs)


def build(name: str, seed: int = 0, planned_steps: int = 100, **extra):
    torch.manual_seed(seed)
    setup = TrainingSetup(CPU, planned_steps, torch.Generator().manual_seed(seed))
    return build_algorithm(config(name, **extra), OBS_DIM, ACT_DIM, setup)


def off_policy_batch(utd: int = 2, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    shape = (utd, BATCH)
    return Batch(
        obs=torch.randn(*shape, OBS_DIM, generator=g),
        action=torch.rand(*shape, ACT_DIM, generator=g) * 2 - 1,
        reward=torch.randn(*shape, generator=g),
        next_obs=torch.randn(*shape, OBS_DIM, generator=g),
        terminated=(torch.rand(*shape, generator=g) < 0.2).float(),
        discount=torch.full(shape, 0.99),
    )


def rollout(seed: int = 0, steps: int = 8, envs: int = 2) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    column = lambda *shape: torch.randn(steps, envs, *shape, generator=g)  # noqa: E731
    ended = torch.zeros(steps, envs)
    ended[3] = 1.0
    return Rollout(column(OBS_DIM), column(ACT_DIM), column() - 2.0, column(), column(), column(), ended, ended.flip(0))


def parts_of(algo):
    """What the update reads: the SAC family's, TD3's and CrossQ's `ActorCriticParts`; the other
    algorithms hold theirs as attributes."""
    return getattr(algo, "agent", algo)


def data_for(name: str, seed: int = 0):
    return off_policy_batch(seed=seed) if name in OFF_POLICY else rollout(seed)


def merge_some_stats(algo) -> None:
    algo.merge_stats((20, np.full(OBS_DIM, 0.5), np.full(OBS_DIM, 2.0)), (20, 1.0, 4.0, 6.0))


# --- the contract ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_update_returns_tensor_diagnostics_and_health_counts(name: str) -> None:
    algo = build(name)
    merge_some_stats(algo)
    diagnostics = algo.update(data_for(name))
    assert diagnostics and all(isinstance(value, torch.Tensor) for value in diagnostics.values()), name
    floats = diagnostics_to_floats(diagnostics)
    assert all(np.isfinite(value) for key, value in floats.items() if key != "critic/explained_var"), floats
    health = algo.health()
    assert isinstance(health, Health) and health.skipped_updates == 0 and health.consecutive_skips == 0
    assert 0 < health.largest_value < 1e3
    policy = algo.policy_state()
    assert policy and all(tensor.device.type == "cpu" for tensor in policy.values())
    # the normalizers took the merged statistics (they travel with the acting policy's weights)
    assert float(policy["obs_norm.count"]) == 20


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_updates_draw_from_the_given_generator_only(name: str) -> None:
    """Every random draw of an update (sampled actions, target noise, dropout masks, minibatch order)
    comes from the generator the algorithm was built with: torch's global generator is untouched,
    and the generator moved on."""
    algo = build(name)
    merge_some_stats(algo)
    global_state, given_state = torch.get_rng_state(), parts_of(algo).generator.get_state()
    algo.update(data_for(name))
    assert torch.equal(torch.get_rng_state(), global_state)
    assert not torch.equal(parts_of(algo).generator.get_state(), given_state)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_state_dict_round_trips_into_a_fresh_instance(name: str) -> None:
    """A fresh instance (other initial weights) that loads the state of one that has learned makes
    the same next update, number for number, given the same random stream."""
    algo = build(name, seed=0)
    merge_some_stats(algo)
    algo.update(data_for(name, seed=1))
    fresh = build(name, seed=7)
    before = zip(algo.policy_state().values(), fresh.policy_state().values(), strict=True)
    assert any(not torch.equal(a, b) for a, b in before)
    fresh.load_state_dict(copy.deepcopy(algo.state_dict()))

    parts_of(algo).generator.manual_seed(3)  # the learner checkpoints its generator; here both are given one stream
    expected = diagnostics_to_floats(algo.update(data_for(name, seed=2)))
    parts_of(fresh).generator.manual_seed(3)
    actual = diagnostics_to_floats(fresh.update(data_for(name, seed=2)))
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key] == value or (np.isnan(value) and np.isnan(actual[key])), key
    for (key, a), b in zip(algo.policy_state().items(), fresh.policy_state().values(), strict=True):
        assert torch.equal(a, b), key


@pytest.mark.parametrize(("name", "actor_first"), [
    ("sac", False), ("droq", False), ("sac_dist", False), ("sac_simba", True), ("sac_dist_simba", True)
])
def test_the_sac_orchestrator_steps_the_actor_where_the_variants_order_says(name: str, actor_first: bool) -> None:
    """`sac_family.fleet_step`: SimbaV2's order steps the actor first, on the first batch, so its loss
    is the one the untouched critics give; SAC's steps it after the critics, on the last batch, whose
    critics have moved by then."""
    algo = build(name)
    merge_some_stats(algo)
    parts, batch = algo.agent, off_policy_batch(utd=2)
    with torch.no_grad():
        same_noise = torch.Generator().set_state(parts.generator.get_state())
        action, log_prob = parts.policy(batch.at(0).obs, same_noise)
        q = parts.critic(parts.policy.obs_norm(batch.at(0).obs), action)
        q = expected_value(q, parts.support) if parts.support is not None else q
        untouched = float(sac_actor_loss(log_prob, q, parts.log_alpha.exp()))
    actor_loss = float(algo.update(batch)[ACTOR_LOSS])
    assert (actor_loss == pytest.approx(untouched, rel=1e-6)) == actor_first


def test_each_config_names_its_family() -> None:
    assert {name: entry.config.family for name, entry in ALGORITHMS.items() if name not in OFF_POLICY} == {
        "ppo": "on_policy"
    }
    assert {type(config(name)).replay_actor for name in OFF_POLICY} == {True}


# --- RLPD diagnostics ---------------------------------------------------------------------------


def critic_values(algo, batch: Batch) -> torch.Tensor:
    """The online critics' Q (C, B) on a batch, as the critic step sees them before it steps."""
    one_batch_of_both = isinstance(algo, CrossQ)
    algo = parts_of(algo)
    with torch.no_grad():
        obs = algo.policy.obs_norm(batch.obs)
        if one_batch_of_both:  # CrossQ normalizes [(s, a); (s', a')] as one batch: the same a' noise
            same_noise = torch.Generator().set_state(algo.generator.get_state())
            with evaluating(algo.policy):
                next_action, _ = algo.policy(batch.next_obs, same_noise)
            critic = copy.deepcopy(algo.critic)  # the forward moves the running statistics
            next_obs = algo.policy.obs_norm(batch.next_obs)
            return critic(torch.cat([obs, next_obs]), torch.cat([batch.action, next_action]))[:, : len(obs)]
        out = algo.critic(obs, batch.action)
    return expected_value(out, algo.support) if out.ndim == 3 else out


@pytest.mark.parametrize("name", OFF_POLICY)
def test_every_off_policy_algorithm_logs_rlpd_diagnostics_from_the_prior_rows(name: str) -> None:
    """With prior_data the first round(ratio x B) rows are the dataset's: prior_q is the mean Q over
    exactly those rows. The prior rows here sit far from the online ones, so the two means differ."""
    ratio = 0.25
    no_dropout = {"dropout_rate": 1e-9} if name == "droq" else {}  # so that Q is what this test computes
    algo = build(name, prior_data="prior.parquet", prior_data_ratio=ratio, **no_dropout)
    batch = off_policy_batch(utd=1)
    rows = round(ratio * BATCH)
    batch.obs[0, :rows] += 4.0
    batch.action[0, :rows] = 1.0
    q = critic_values(algo, batch.at(0))  # the critics do not move before the (only) critic step
    info = diagnostics_to_floats(algo.update(batch))
    assert set(RLPD_DIAGNOSTICS) <= info.keys()
    assert all(np.isfinite(info[key]) for key in RLPD_DIAGNOSTICS)
    assert info[CRITIC_PRIOR_Q] == pytest.approx(q[:, :rows].mean().item(), rel=1e-5, abs=1e-6)
    assert info[CRITIC_PRIOR_ONLINE_Q_GAP] == pytest.approx(q[:, :rows].mean().item() - q[:, rows:].mean().item(),
                                                           rel=1e-4, abs=1e-6)
    assert abs(info[CRITIC_PRIOR_ONLINE_Q_GAP]) > 1e-4
    # without prior data there is nothing to compare
    assert set(RLPD_DIAGNOSTICS).isdisjoint(build(name).update(off_policy_batch(utd=1)))


# --- the learning-rate schedule -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_lr_schedule_reaches_every_optimizer_and_survives_a_checkpoint(name: str) -> None:
    """lr_end_fraction 0.5 over 2 planned fleet steps: every rate ends at half its start (PPO's one
    update is train_every fleet steps), and a fresh instance loading the state has the same rates."""
    extra = {"lr_end_fraction": 0.5} | ({"desired_kl": None} if name == "ppo" else {})
    algo = build(name, planned_steps=2, **extra)
    optimizers = [part.optimizer if hasattr(part, "optimizer") else part for key, part in algo.parts().items()
                  if key.endswith("_step") or key == "optimizer"]
    starts = [float(group["lr"]) for optimizer in optimizers for group in optimizer.param_groups]
    for _ in range(1 if name == "ppo" else 2):
        algo.update(data_for(name))
    ends = [float(group["lr"]) for optimizer in optimizers for group in optimizer.param_groups]
    assert ends == pytest.approx([start / 2 for start in starts])
    fresh = build(name, planned_steps=2, **extra)
    fresh.load_state_dict(copy.deepcopy(algo.state_dict()))
    fresh_parts = [fresh.parts()[key] for key in algo.parts() if key.endswith("_step") or key == "optimizer"]
    loaded = [float(group["lr"]) for part in fresh_parts for group in getattr(part, "optimizer", part).param_groups]
    assert loaded == pytest.approx(ends)


def test_simba_variants_default_to_the_papers_decay() -> None:
    for name in ("sac_simba", "sac_dist_simba"):
        cfg = ALGORITHMS[name].config()
        assert (cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, cfg.lr_end_fraction) == (1e-4, 1e-4, 1e-4, 0.5)
        assert (cfg.init_alpha, cfg.target_entropy_per_dim, cfg.normalize_obs) == (0.01, -0.5, True)


# --- old knobs and old checkpoints -----------------------------------------------------------------


def old_spec(algo: dict) -> dict:
    return {"name": "old", "env": {"id": "Pendulum-v1"}, "budget": {"env_steps": 10_000}, "algo": algo}


OLD_SECTIONS = [  # (a section in the old names, what the new one must say)
    ({"name": "sac", "hidden_dims": [64, 32], "actor_lr": 1e-4}, {"actor_hidden_dims": [64, 32],
                                                                  "critic_hidden_dims": [64, 32], "actor_lr": 1e-4}),
    ({"name": "td3", "hidden_dims": [16]}, {"actor_hidden_dims": [16], "critic_hidden_dims": [16]}),
    ({"name": "sac_dist", "hidden_dims": [32], "num_atoms": 21}, {"critic_hidden_dims": [32], "num_atoms": 21}),
    ({"name": "sac_simba", "learning_rate": 3e-4, "learning_rate_end": 3e-5},
     {"actor_lr": 3e-4, "critic_lr": 3e-4, "alpha_lr": 3e-4, "lr_end_fraction": 0.1}),
    ({"name": "sac_dist_simba", "learning_rate_end": 2e-5}, {"actor_lr": 1e-4, "lr_end_fraction": 0.2}),
    ({"name": "ppo", "lr": 1e-3, "hidden_dims": [8]}, {"actor_lr": 1e-3, "critic_lr": 1e-3, "actor_hidden_dims": [8]}),
]


@pytest.mark.parametrize(("old", "expected"), OLD_SECTIONS)
def test_old_knobs_migrate_to_configs_that_validate(old: dict, expected: dict) -> None:
    new = migrate_old_knobs(old)
    algo = validate_spec(old_spec(new)).algo
    for key, value in expected.items():
        assert getattr(algo, key) == pytest.approx(value), key
    assert migrate_old_knobs(new) == new  # today's names pass through unchanged
    assert old == dict(old)  # the input is not modified
    with pytest.raises(ValueError, match="renamed"):
        validate_spec(old_spec(old))


@pytest.mark.parametrize("name", sorted(path.name for path in FIXTURES.iterdir()))  # the algorithms of then
def test_format2_checkpoints_load_into_todays_algorithms(name: str) -> None:
    """The checkpoints written before the redesign (tests/fixtures/format2): their spec's algo
    section migrates and validates, and their algorithm state loads under the same keys."""
    spec_raw = yaml.safe_load((FIXTURES / name / "spec.yaml").read_text())
    spec_raw["algo"] = migrate_old_knobs(spec_raw["algo"])
    spec = validate_spec(spec_raw)
    payload = torch.load(FIXTURES / name / "state.pt", weights_only=True)
    # aa_ray/PusherReach-v0: 10 obs dims, 2 actions
    algo = build_algorithm(spec.algo, 10, 2, TrainingSetup.on_cpu(planned_steps=100))
    algo.load_state_dict(payload["learner"]["algo"])
    saved = payload["learner"]["algo"]["policy"]
    assert all(torch.equal(saved[key], value) for key, value in algo.policy_state().items())
    if name == "sac_simba":  # the old schedule's position came along: 1e-4 decayed toward 5e-5
        lr = algo.parts()["actor_step"].optimizer.param_groups[0]["lr"]
        assert lr == pytest.approx(1e-4 * (1 - 0.5 * min(payload["learner"]["algo"]["steps_done"] / 100, 1.0)))
