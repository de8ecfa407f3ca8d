"""MuJoCo Playground as a batched env source (`env.batched: playground`, aa_ray/envs/playground.py):
the BatchedEnv contract on a real MJX task run by JAX on the CPU, and SAC learning it end to end
through the batched runner. Skipped where the playground extra is not installed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("mujoco_playground",
                    reason="MuJoCo Playground is an optional extra: pip install aa-ray[playground]")

from aa_ray.envs.batched import BatchedEnv, BatchedEnvError  # noqa: E402
from aa_ray.envs.playground import make_playground_env  # noqa: E402

ENVS, EPISODE = 8, 5


@pytest.fixture(scope="module")
def cartpole() -> BatchedEnv:
    """8 CartpoleBalance copies with 5-step episodes (its programs compile once for the module)."""
    return make_playground_env("CartpoleBalance", ENVS, "cpu", max_episode_steps=EPISODE,
                               info_metrics=("reward/upright",))


def pushes(steps: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand((ENVS, 1), generator=generator) * 2 - 1 for _ in range(steps)]


def test_shapes_dtypes_bounds_and_one_transition_per_copy(cartpole: BatchedEnv) -> None:
    assert isinstance(cartpole, BatchedEnv)
    assert (cartpole.obs_dims.actor, cartpole.obs_dims.full, cartpole.act_dim) == (5, 5, 1)  # x, cos, sin, 2 vel
    assert cartpole.action_low.tolist() == [-1.0] and cartpole.action_high.tolist() == [1.0]
    obs = cartpole.reset(seed=3)
    assert obs.shape == (ENVS, 5) and obs.dtype == torch.float32 and obs.device.type == "cpu"
    step = cartpole.step(pushes(1)[0])
    assert step.obs.shape == step.next_obs.shape == (ENVS, 5) and step.obs.dtype == torch.float32
    assert step.reward.shape == (ENVS,) and step.reward.dtype == torch.float32
    assert torch.all((step.reward > 0) & (step.reward <= 1))  # the pole starts upright: every factor near 1
    assert step.terminated.dtype == step.truncated.dtype == step.valid.dtype == torch.bool
    assert step.valid.all() and not (step.terminated | step.truncated).any()
    assert not torch.equal(step.obs, obs)  # the carts moved


def test_episodes_end_at_the_time_limit_with_the_true_final_observation(cartpole: BatchedEnv) -> None:
    cartpole.reset(seed=4)
    actions = pushes(EPISODE + 1, seed=1)
    for action in actions[:EPISODE - 1]:
        cartpole.step(action)
    before_last = cartpole.state()
    last = cartpole.step(actions[EPISODE - 1])
    assert last.truncated.all() and not last.terminated.any() and last.valid.all()
    # the same step without the time limit (its step counters set back) gives the final observation
    unlimited = dict(before_last, steps=torch.zeros_like(before_last["steps"]))
    cartpole.load_state(unlimited)
    continued = cartpole.step(actions[EPISODE - 1])
    assert not continued.truncated.any()
    assert torch.equal(last.next_obs, continued.obs) and torch.equal(last.reward, continued.reward)
    # ... and the copies start again within that step: what to act on is a fresh start, far from the final one
    assert (last.obs - last.next_obs).abs().amax(dim=1).min() > 1e-3
    assert last.obs[:, 3:].abs().max() < 0.1  # starts have small velocities; five random pushes gave larger
    upright, ended = last.episode_info["reward/upright"]
    assert ended.all() and upright.shape == (ENVS,) and torch.all((upright > 0.9) & (upright <= 1))
    assert "is_success" not in last.episode_info  # Playground tasks report none
    # the next episode runs its full length again
    cartpole.load_state(before_last)
    cartpole.step(actions[EPISODE - 1])
    flags = [cartpole.step(action).truncated for action in pushes(EPISODE)]
    assert [bool(f.any()) for f in flags] == [False] * (EPISODE - 1) + [True]


def test_a_seed_gives_the_same_starts_and_steps(cartpole: BatchedEnv) -> None:
    first = cartpole.reset(seed=2**40 + 7)  # aa-ray's seeds are 64-bit words: the high bits count too
    first_step = cartpole.step(pushes(1)[0]).obs
    again = cartpole.reset(seed=2**40 + 7)
    assert torch.equal(first, again) and torch.equal(first_step, cartpole.step(pushes(1)[0]).obs)
    assert not torch.equal(first, cartpole.reset(seed=7))
    assert len({tuple(row.tolist()) for row in first}) == ENVS  # every copy its own start


def test_a_saved_state_repeats_the_steps_after_it_through_a_checkpoint_file(cartpole: BatchedEnv, tmp_path) -> None:
    cartpole.reset(seed=5)
    for action in pushes(3):
        cartpole.step(action)
    torch.save(cartpole.state(), tmp_path / "env.pt")
    later = pushes(2 * EPISODE, seed=9)  # across an episode's end and its resets
    expected = [cartpole.step(action) for action in later]
    cartpole.reset(seed=6)
    cartpole.load_state(torch.load(tmp_path / "env.pt", weights_only=True))  # as aa-ray reads checkpoints
    for action, step in zip(later, expected, strict=True):
        repeated = cartpole.step(action)
        assert torch.equal(repeated.obs, step.obs) and torch.equal(repeated.next_obs, step.next_obs)
        assert torch.equal(repeated.reward, step.reward) and torch.equal(repeated.truncated, step.truncated)
    wrong = dict(cartpole.state(), num_envs=ENVS + 1)
    with pytest.raises(ValueError, match="same task and number of envs"):
        cartpole.load_state(wrong)


def cartpole_with_groups(**options: Any) -> Any:
    """CartpoleBalance whose observations are Playground's Dict of groups: `state` (what the task
    observes) and `privileged_state` (the same, then the joint positions), as its locomotion tasks'."""
    import jax.numpy as jnp
    from mujoco_playground import registry, wrapper

    class Grouped(wrapper.Wrapper):
        def reset(self, rng: Any) -> Any:
            return self._grouped(self.env.reset(rng))

        def step(self, state: Any, action: Any) -> Any:
            return self._grouped(self.env.step(state.replace(obs=state.obs["state"]), action))

        def _grouped(self, state: Any) -> Any:
            return state.replace(obs={"state": state.obs,
                                      "privileged_state": jnp.concatenate([state.obs, state.data.qpos])})

        @property
        def observation_size(self) -> dict[str, tuple[int, ...]]:
            size = self.env.observation_size
            return {"state": (size,), "privileged_state": (size + self.env.mj_model.nq,)}

    return Grouped(registry.load("CartpoleBalance", config_overrides={"impl": "jax", **options}))


def test_observation_groups_laid_out_for_the_actor_and_the_critic() -> None:
    envs = make_playground_env(cartpole_with_groups, 4, "cpu", max_episode_steps=EPISODE, actor_obs=["state"],
                               critic_obs=["state", "privileged_state"])
    assert (envs.obs_dims.actor, envs.obs_dims.full) == (5, 12)
    assert envs.obs_dims.groups == (("state", 5), ("privileged_state", 7))
    obs = envs.reset(seed=0)
    step = envs.step(torch.zeros(4, 1))
    for flat in (obs, step.obs, step.next_obs):
        assert flat.shape == (4, 12)
        assert torch.equal(flat[:, :5], flat[:, 5:10])  # the actor's group first, then the critic's other one
    assert torch.equal(step.next_obs[:, 10], step.next_obs[:, 0])  # the slider's position is the cart's x
    with pytest.raises(BatchedEnvError, match="max_episode_steps"):
        make_playground_env(cartpole_with_groups, 4, "cpu")


def test_an_unknown_task_or_option_is_refused_with_what_to_change() -> None:
    with pytest.raises(BatchedEnvError, match="env.id: .*no task 'CartpoleBalanse'.*CartpoleBalance"):
        make_playground_env("CartpoleBalanse", 2)
    with pytest.raises(BatchedEnvError, match="env.kwargs: .*episode_lenght.*episode_length"):
        make_playground_env("CartpoleBalance", 2, episode_lenght=100)
    with pytest.raises(BatchedEnvError, match="positive integer"):
        make_playground_env("CartpoleBalance", 0)


@pytest.mark.learning
def test_sac_learns_cartpole_balance_through_the_batched_runner() -> None:
    """16 cartpoles in one jitted JAX call, the JAX programs compiled inside the run: the evaluation
    return over 250 steps rises from the untrained policy's (77-103 for seeds 1-4, whose steady pushes
    run the cart off) past what pushing nothing scores (about 175) to 220 within 24k env steps (seeds
    0-4 reached 224-241 at 12k-14k env steps; 32-36 s of CPU per run, imports and compiling included)."""
    from learning_runs import train

    result = train("sac_playground_cartpole.yaml", "budget.env_steps=24000")
    returns = [evaluation["eval/return"] for evaluation in result.evals]
    assert returns[0] < 195 and max(returns) >= 220, returns
