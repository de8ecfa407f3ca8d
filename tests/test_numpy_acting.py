"""A runner's numpy acting (aa_ray/nets/numpy_acting.py) against the torch policy it copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aa_ray.algos.registry import build_policy
from aa_ray.nets.numpy_acting import numpy_acting
from aa_ray.nets.policy import state_arrays
from aa_ray.records import ObsDims
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.spec.loader import validate_spec

# grouped observations: the actor reads the leading 5 of 8 features, the normalizer holds all 8
OBS, ACT_DIM = ObsDims(actor=5, full=8), 3


def algo_config(name: str, **knobs: object):
    raw = {"name": "numpy-acting", "env": {"id": "Pendulum-v1"}, "algo": {"name": name, **knobs},
           "budget": {"env_steps": 100_000}}
    return validate_spec(raw).algo


def trained_looking(policy: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The policy with weights and normalizer statistics far from their initial values, as a runner
    loads them mid-run."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        features = policy.obs_norm.mean.shape[0]
        policy.obs_norm.merge(50.0, np.linspace(-3.0, 3.0, features), np.linspace(0.1, 9.0, features))
    return policy


def observations(envs: int) -> np.ndarray:
    # float64, as MuJoCo's envs give them; some features far out, so that the normalizer's clip acts
    return np.random.default_rng(envs).normal(0.0, 20.0, (envs, OBS.full))


@pytest.mark.parametrize(
    ("algo", "knobs"),
    [
        ("sac", {"actor_hidden_dims": [32, 32], "normalize_obs": True}),
        ("sac", {"actor_hidden_dims": [16], "normalize_obs": False}),
        ("td3", {"actor_hidden_dims": [32, 32], "exploration_noise": 0.3, "normalize_obs": True}),
        ("td3", {"actor_hidden_dims": [32], "exploration_noise": 0.0}),
    ],
)
@pytest.mark.parametrize("envs", [1, 16])
def test_numpy_acting_gives_the_torch_policys_actions_from_the_same_draws(algo: str, knobs: dict, envs: int) -> None:
    policy = trained_looking(build_policy(algo_config(algo, **knobs), OBS, ACT_DIM), seed=envs)
    act = numpy_acting(policy)
    assert act is not None
    obs = observations(envs)
    ours, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(3):  # consecutive draws stay in step
        action = act(obs, ours)
        expected = policy.act(obs, deterministic=False, generator=theirs)
        assert action.dtype == np.float32 and action.shape == (envs, ACT_DIM)
        np.testing.assert_allclose(action, expected, rtol=0, atol=1e-5)
    assert torch.equal(ours.get_state(), theirs.get_state())


@pytest.mark.parametrize(
    ("algo", "knobs"),
    [("sac_simba", {}), ("crossq", {}), ("fast_td3", {}), ("fast_sac", {})],
)
def test_policies_that_are_not_plain_mlps_act_through_torch(algo: str, knobs: dict) -> None:
    assert numpy_acting(build_policy(algo_config(algo, **knobs), OBS, ACT_DIM)) is None


def read_only(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for array in state.values():
        array.setflags(write=False)  # as Ray hands out arrays from its object store
    return state


def test_a_runner_acts_with_the_weights_it_loaded_last_in_the_form_learners_publish_them() -> None:
    spec = validate_spec({
        "name": "numpy-acting", "env": {"id": "Pendulum-v1"},
        "algo": {"name": "sac", "actor_hidden_dims": [32], "critic_hidden_dims": [32], "warm_up_steps": 0},
        "budget": {"env_steps": 1000},
    })
    runner = EnvRunner(spec, index=0)
    assert runner.numpy_act is not None
    source = trained_looking(build_policy(spec.algo, runner.obs_dims, runner.act_dim), seed=3)
    weights = read_only(state_arrays({k: v.clone() for k, v in source.state_dict().items()}))
    before = runner.generator.get_state()
    transitions, _ = runner.sample(4, random_actions=False, weights=weights, version=1)
    replay = torch.Generator()
    replay.set_state(before)
    expected = [source.act(obs[None], deterministic=False, generator=replay)[0] for obs in transitions.obs]
    np.testing.assert_allclose(transitions.action, expected, rtol=0, atol=1e-5)
