"""Batched envs: PointReach (our torch batched task) and the adapters that turn each source into the
`BatchedEnv` contract (aa_ray/envs/batched.py): shapes, dtypes and device; what `obs`, `next_obs`
and `valid` hold where an episode ends under each source's autoreset convention; info metrics at
episode ends; a state round trip that repeats the next steps exactly; one error per refused input."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from aa_ray.envs.batched import BatchedEnv, BatchedEnvError, BatchedStep, make_batched_env
from aa_ray.envs.point_reach import SUCCESS_RADIUS, PointReach
from aa_ray.errors import SpecError

sys.path.insert(0, str(Path(__file__).parent / "user_envs"))
import batched_envs  # noqa: E402  (tests/user_envs, put on the path above)

GROUPS = {"actor_obs": ["policy"], "critic_obs": ["policy", "critic"]}


def random_actions(steps: int, num_envs: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand((num_envs, 2), generator=generator) * 2 - 1 for _ in range(steps)]


def reach_controller(policy_obs: torch.Tensor) -> torch.Tensor:
    """A PD controller toward the target from the policy group (position, velocity, offset)."""
    return (4.0 * policy_obs[:, 4:6] - 0.5 * policy_obs[:, 2:4]).clamp(-1, 1)


def flat(groups: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([groups["policy"], groups["critic"]], dim=-1)


# ---------------------------------------------------------------- PointReach itself


def test_point_reach_spaces_shapes_and_dtypes():
    env = PointReach(16)
    obs, extras = env.reset(seed=3)
    assert extras == {}
    for key, dim in (("policy", 6), ("critic", 4)):
        assert obs[key].shape == (16, dim) and obs[key].dtype == torch.float32 and obs[key].device.type == "cpu"
        assert env.observation_space[key].shape == (dim,)
        assert all(env.observation_space[key].contains(row.numpy()) for row in obs[key])
    obs, reward, terminated, truncated, extras = env.step(random_actions(1, 16)[0])
    assert reward.shape == (16,) and reward.dtype == torch.float32
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool and terminated.shape == (16,)
    assert set(extras) == {"final_obs", "final_info"} and set(extras["final_info"]) == {"distance", "is_success"}
    assert env.metadata["info_metrics"] == ["distance"]


def test_point_reach_time_limit_resets_in_the_same_step():
    env = PointReach(32, max_episode_steps=5)
    env.reset(seed=1)
    for t, action in enumerate(random_actions(5, 32), start=1):
        obs, reward, terminated, truncated, extras = env.step(action)
        final = extras["final_obs"]
        if t < 5:
            assert not truncated.any() and torch.equal(flat(final), flat(obs))
            continue
        assert truncated.all() and not terminated.any()
        # the final observation is the one the step reached: its offset's norm is the reported distance
        distance = torch.linalg.vector_norm(final["policy"][:, 4:6], dim=-1)
        torch.testing.assert_close(distance, extras["final_info"]["distance"])
        torch.testing.assert_close(reward, -distance)  # random starts and targets: nobody inside the radius
        # obs is a fresh start: at rest, no previous action, another position and target
        assert torch.all(obs["policy"][:, 2:4] == 0) and torch.all(obs["critic"][:, 2:4] == 0)
        assert not torch.equal(obs["policy"][:, :2], final["policy"][:, :2])
        assert not torch.equal(obs["critic"][:, :2], final["critic"][:, :2])


def test_point_reach_success_terminates_and_pays_the_bonus():
    env = PointReach(64, terminate_on_success=True)
    obs, _ = env.reset(seed=2)
    ended = torch.zeros(64, dtype=torch.bool)
    for _ in range(60):
        obs, reward, terminated, truncated, extras = env.step(reach_controller(obs["policy"]))
        info = extras["final_info"]
        assert torch.equal(terminated, info["is_success"]) and not (terminated & truncated).any()
        assert torch.all(info["distance"][terminated] < SUCCESS_RADIUS)
        torch.testing.assert_close(reward[terminated], 1.0 - info["distance"][terminated])
        ended |= terminated
    assert ended.all(), "the scripted controller reaches every target within 60 steps"


def test_point_reach_state_round_trip_repeats_the_next_steps():
    env = PointReach(32, max_episode_steps=12, terminate_on_success=True)
    env.reset(seed=7)
    for action in random_actions(10, 32, seed=1):
        env.step(action)
    state = env.state_dict()
    actions = random_actions(30, 32, seed=2)  # episodes end (time limit) and restart on the way

    def run(task: PointReach) -> list[torch.Tensor]:
        out = []
        for action in actions:
            obs, reward, terminated, truncated, extras = task.step(action)
            out += [flat(obs), flat(extras["final_obs"]), reward, terminated, truncated]
        return out

    expected = run(env)
    resumed = PointReach(32, max_episode_steps=12, terminate_on_success=True)
    resumed.reset(seed=99)  # another stream: everything must come from the state
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(expected, run(resumed), strict=True))
    with pytest.raises(ValueError, match="same number of envs"):
        PointReach(16).load_state_dict(state)


def test_point_reach_4096_envs_step_as_one_batch():
    """The same tensor ops whatever the number of copies (no Python loop over envs), and well over a
    million env steps per second on one CPU thread at 4096 envs."""

    def ops_per_step(num_envs: int) -> int:
        env = PointReach(num_envs)
        env.reset(seed=0)
        action = torch.zeros(num_envs, 2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            env.step(action)
        return sum(1 for event in profile.events() if event.name.startswith("aten::"))

    assert ops_per_step(64) == ops_per_step(4096)

    env = PointReach(4096)
    env.reset(seed=0)
    action = torch.zeros(4096, 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(5):  # the best of five: another process on a shared core only slows some rounds
            start = time.perf_counter()
            for _ in range(20):
                env.step(action)
            best = min(best, (time.perf_counter() - start) / 20)
    finally:
        torch.set_num_threads(threads)
    assert 4096 / best > 1e6, f"{4096 / best:,.0f} env steps/s"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_envs": 0}, "num_envs must be a positive integer"),
    ({"num_envs": 4, "max_episode_steps": 0}, r"max_episode_steps \(env.kwargs\)"),
    ({"num_envs": 4, "success_bonus": float("nan")}, r"success_bonus \(env.kwargs\)"),
])
def test_point_reach_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PointReach(**kwargs)


# ---------------------------------------------------------------- torch source (Isaac Lab / mjlab shape)


# the groups in the env's own order (its observation's column ranges, handed on as one view) and
# reversed (copied side by side): both are the layout's flat vector
@pytest.mark.parametrize("order", [("policy", "critic"), ("critic", "policy")])
def test_torch_adapter_same_step_contract(order):
    def flat_in_order(groups: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([groups[key] for key in order], dim=-1)

    env = make_batched_env("torch", "aa_ray.envs.point_reach:PointReach", 16, "cpu", max_episode_steps=4,
                           actor_obs=order[:1], critic_obs=order)
    raw = PointReach(16, max_episode_steps=4)  # the same task stepped alongside, to check what the adapter says
    assert isinstance(env, BatchedEnv)
    assert env.num_envs == 16 and env.device == torch.device("cpu") and env.act_dim == 2
    assert env.obs_dims.full == 10 and env.obs_dims.actor_keys == order[:1]
    assert torch.equal(env.action_low, -torch.ones(2)) and torch.equal(env.action_high, torch.ones(2))
    assert env.info_keys == ("is_success", "distance")
    obs = env.reset(seed=5)
    assert torch.equal(obs, flat_in_order(raw.reset(seed=5)[0]))
    for t, action in enumerate(random_actions(4, 16), start=1):
        step = env.step(action)
        raw_obs, raw_reward, _, raw_truncated, extras = raw.step(action)
        assert isinstance(step, BatchedStep) and step.obs.dtype == torch.float32 and step.obs.shape == (16, 10)
        assert step.valid.all() and torch.equal(step.reward, raw_reward) and torch.equal(step.truncated, raw_truncated)
        assert torch.equal(step.obs, flat_in_order(raw_obs))
        assert torch.equal(step.next_obs, flat_in_order(extras["final_obs"]))
        values, mask = step.episode_info["distance"]
        assert torch.equal(mask, step.truncated | step.terminated)
        assert torch.equal(values[mask], extras["final_info"]["distance"][mask])
        assert step.truncated.all() == (t == 4)
    assert not torch.equal(step.obs, step.next_obs)


def test_torch_adapter_without_final_obs_drops_truncated_rows():
    """An Isaac Lab-style task (batched spaces, no final observation): terminated rows stay (their next
    value is never used), truncated rows are no transitions."""
    env = make_batched_env("torch", batched_envs.IsaacStyleReach, 32, max_episode_steps=40, terminate_on_success=True,
                           **GROUPS)
    assert (env.obs_dims.actor, env.obs_dims.full) == (6, 10)  # one copy's dims out of the batch's spaces
    obs = env.reset(seed=4)
    steering = torch.arange(32) < 16  # half reach their targets and terminate, the rest drift until the time limit
    seen_terminated = seen_truncated = False
    for _ in range(40):
        step = env.step(torch.where(steering.unsqueeze(-1), reach_controller(obs[:, :6]), 0.0))
        assert torch.equal(step.valid, ~step.truncated)
        assert torch.equal(step.next_obs, step.obs)
        assert torch.equal(step.episode_info["is_success"][1], step.terminated | step.truncated)
        seen_terminated |= bool(step.terminated.any())
        seen_truncated |= bool(step.truncated.any())
        obs = step.obs
    assert seen_terminated and seen_truncated


def test_torch_adapter_flat_observations():
    env = make_batched_env("torch", batched_envs.FlatReach, 8, max_episode_steps=2)
    assert (env.obs_dims.actor, env.obs_dims.full, env.obs_dims.groups) == (6, 6, ())
    env.reset(seed=0)
    env.step(torch.zeros(8, 2))
    step = env.step(torch.ones(8, 2))
    assert step.truncated.all() and step.valid.all()
    assert torch.all(step.next_obs[:, 2:4] > 0) and torch.all(step.obs[:, 2:4] == 0)  # moving, then at rest


def test_torch_adapter_state_round_trip():
    def make() -> BatchedEnv:
        return make_batched_env("torch", PointReach, 16, max_episode_steps=6, **GROUPS)

    env = make()
    env.reset(seed=3)
    for action in random_actions(4, 16):
        env.step(action)
    state = env.state()
    actions = random_actions(10, 16, seed=5)
    expected = [env.step(action) for action in actions]
    resumed = make()
    resumed.reset(seed=0)
    resumed.load_state(state)
    for want, got in zip(expected, (resumed.step(action) for action in actions), strict=True):
        for name in ("obs", "next_obs", "reward", "terminated", "truncated", "valid"):
            assert torch.equal(getattr(want, name), getattr(got, name)), name


# ---------------------------------------------------------------- gymnasium VectorEnv source


def run_vector(mode: str, steps: int = 8) -> list[BatchedStep]:
    envs = batched_envs.point_reach_vector(4, mode)  # copies 0 and 2 end every 3 steps, 1 and 3 every 5
    env = make_batched_env("gymnasium", lambda num_envs: envs, 4, info_metrics=["error"])
    assert env.obs_dims == (4, 4, ()) and env.info_keys == ("is_success", "error")
    env.reset(seed=11)
    generator = torch.Generator().manual_seed(0)
    out = [env.step(torch.rand((4, 2), generator=generator) * 2 - 1) for _ in range(steps)]
    env.close()
    return out


def test_vector_adapter_next_step_marks_the_reset_row_invalid():
    steps = run_vector("NextStep")
    third, fourth = steps[2], steps[3]
    assert third.obs.dtype == torch.float32 and third.obs.shape == (4, 4)
    assert torch.equal(third.truncated, torch.tensor([True, False, True, False]))
    assert third.valid.all() and torch.equal(third.next_obs, third.obs)  # the env has not reset yet
    assert torch.equal(fourth.valid, torch.tensor([False, True, False, True]))
    assert torch.all(fourth.reward[~fourth.valid] == 0) and not fourth.truncated.any()
    values, mask = third.episode_info["error"]
    assert torch.equal(mask, third.truncated)
    torch.testing.assert_close(values[mask], torch.linalg.vector_norm(third.next_obs[mask, 2:], dim=-1))
    assert not fourth.episode_info["error"][1].any()  # the reset row reports no episode


def test_vector_adapter_same_step_and_disabled_agree_with_next_step():
    """One seed, one action sequence, three autoreset modes: the final observation and the fresh
    start are the same wherever each mode puts them."""
    next_step, same_step, disabled = run_vector("NextStep"), run_vector("SameStep"), run_vector("Disabled")
    ended = torch.tensor([True, False, True, False])
    assert same_step[2].valid.all() and torch.equal(same_step[2].truncated, ended)
    assert torch.equal(same_step[2].next_obs, next_step[2].next_obs)  # the final observation
    assert torch.equal(same_step[2].obs[ended], next_step[3].obs[ended])  # the fresh start
    assert not torch.equal(same_step[2].obs[ended], same_step[2].next_obs[ended])
    torch.testing.assert_close(same_step[2].episode_info["error"][0], next_step[2].episode_info["error"][0])
    for a, b in zip(same_step, disabled, strict=True):
        for name in ("obs", "next_obs", "reward", "terminated", "truncated", "valid"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        ends = [step.episode_info["error"][1] if "error" in step.episode_info else torch.zeros(4, dtype=torch.bool)
                for step in (a, b)]  # a same-step env reports final infos only at steps where episodes ended
        assert torch.equal(*ends)


def test_vector_adapter_dict_observations_through_the_layout():
    envs = batched_envs.point_reach_vector(4, "SameStep", goal=True)
    env = make_batched_env("gymnasium", lambda num_envs: envs, 4, actor_obs=["observation", "desired_goal"],
                           critic_obs=["observation", "desired_goal", "achieved_goal"])
    assert (env.obs_dims.actor, env.obs_dims.full) == (4, 6)
    env.reset(seed=0)
    for _ in range(3):
        step = env.step(torch.full((4, 2), 0.5))
    assert torch.equal(step.truncated, torch.tensor([True, False, True, False]))
    # achieved_goal is the position: in the final observations (from info["final_obs"]) and the fresh ones
    assert torch.equal(step.next_obs[:, :2], step.next_obs[:, 4:6]) and torch.equal(step.obs[:, :2], step.obs[:, 4:6])
    assert not torch.equal(step.next_obs[0], step.obs[0])


def test_gymnasium_source_by_registered_id():
    env_id = "aa_ray_test/PointReachVector-v0"
    if env_id not in gym.registry:
        gym.register(env_id, vector_entry_point=batched_envs.point_reach_vector)
    env = make_batched_env("gymnasium", env_id, 6, autoreset_mode="SameStep")
    assert env.num_envs == 6 and env.reset(seed=0).shape == (6, 4)
    assert env.step(torch.zeros(6, 2)).valid.all()


# ---------------------------------------------------------------- EnvPool source


def test_envpool_half_cheetah_next_step_contract():
    pytest.importorskip("envpool", reason="EnvPool is an optional extra: pip install aa-ray[envpool]")
    env = make_batched_env("envpool", "HalfCheetah-v5", 4, num_threads=1, max_episode_steps=3,
                           info_metrics=["x_velocity"])
    assert env.obs_dims == (17, 17, ()) and env.act_dim == 6 and env.state() is None
    first = env.reset(seed=5)
    assert first.shape == (4, 17) and first.dtype == torch.float32
    steps = [env.step(torch.full((4, 6), 0.3)) for _ in range(4)]
    assert all(step.valid.all() for step in steps[:3]) and steps[2].truncated.all()
    assert steps[2].episode_info["x_velocity"][1].all()
    assert not steps[3].valid.any() and torch.all(steps[3].reward == 0)  # EnvPool resets on the next call
    assert torch.equal(env.reset(seed=5), first)  # the pool is made again for a seed, the same seed gives the same
    assert not torch.equal(env.reset(seed=6), first)
    env.close()


@pytest.mark.parametrize(("target", "kwargs", "message"), [
    ("HalfCheetahh-v5", {}, "EnvPool has no task 'HalfCheetahh-v5'.*Did you mean HalfCheetah-v5"),
    ("HalfCheetah-v5", {"bogus_option": 1}, "env.kwargs: EnvPool could not make 'HalfCheetah-v5'"),
    ("HalfCheetah-v5", {"seed": 3}, "env.kwargs: seed is set by aa-ray"),
])
def test_envpool_refusals(target, kwargs, message):
    pytest.importorskip("envpool", reason="EnvPool is an optional extra: pip install aa-ray[envpool]")
    with pytest.raises(BatchedEnvError, match=message):
        make_batched_env("envpool", target, 2, **kwargs)


def test_envpool_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # what `import envpool` meets where it is not installed
    with pytest.raises(BatchedEnvError, match=r"install aa-ray\[envpool\]"):
        make_batched_env("envpool", "HalfCheetah-v5", 2)


# ---------------------------------------------------------------- refused inputs


@pytest.mark.parametrize(("source", "target", "kwargs", "message"), [
    ("mujoco", PointReach, {}, "env.batched: unknown source 'mujoco'; choose one of torch, gymnasium"),
    ("playground", "CartpoleBalance", {}, "env.batched: playground tasks are made by .*make_playground_env"),
    ("torch", PointReach, {"num_envs": 0}, "must be a positive integer"),
    ("torch", batched_envs.NoStep, {}, "env.entry_point: .*NoStep.* has no step"),
    ("torch", batched_envs.UnboundedReach, {}, "env.entry_point: .*unbounded actions.*declare finite ones"),
    ("torch", batched_envs.FixedSizeReach, {}, "asked for 4 envs and made 8"),
    ("torch", "no_such_package.tasks:Reach", {}, "env.entry_point: importing 'no_such_package.tasks'"),
    ("torch", "aa_ray.envs.point_reach:Missing", {}, "env.entry_point: module 'aa_ray.envs.point_reach' has no"),
    ("torch", PointReach, {"actor_obs": ["proprio"]}, "algo.actor_obs: the env's observations have no key 'proprio'"),
    ("gymnasium", "Pendulum-v1", {}, "env.id: gymnasium could not make 'Pendulum-v1' as a batched env"),
    ("gymnasium", "CartPole-v1", {}, "env.id: 'CartPole-v1' has actions Discrete.*flat continuous Box"),
    ("gymnasium", lambda num_envs: PointReach(num_envs), {}, "env.entry_point: .*has no single_observation_space"),
    ("envpool", PointReach, {}, "env.batched: envpool takes a task id in env.id"),
])
def test_refused_inputs_name_the_field(source, target, kwargs, message):
    num_envs = kwargs.pop("num_envs", 4)
    with pytest.raises(BatchedEnvError, match=message) as caught:
        make_batched_env(source, target, num_envs, **kwargs)
    assert isinstance(caught.value, SpecError) and "\n" not in str(caught.value)


# ---------------------------------------------------------------- learning


@pytest.mark.learning
def test_sac_learns_point_reach_through_the_adapter():
    """SAC (aa-ray's, built directly) on 64 PointReach copies through the torch adapter: 600 updates
    (one per batched step, 38k env steps) bring the final distance from about 1.2 (random) below 0.3."""
    from aa_ray.algos.contract import TrainingSetup
    from aa_ray.algos.sac import SAC, SACConfig
    from aa_ray.records import Batch

    torch.manual_seed(0)
    num_envs, updates, warm_up = 64, 600, 2_000
    env = make_batched_env("torch", PointReach, num_envs, **GROUPS)
    cfg = SACConfig(actor_hidden_dims=[64, 64], critic_hidden_dims=[64, 64], batch_size=256, init_alpha=0.1)
    sac = SAC(cfg, env.obs_dims, env.act_dim, TrainingSetup.on_cpu(0, planned_steps=updates))
    generator = torch.Generator().manual_seed(1)
    capacity = num_envs * updates
    replay = {"obs": torch.zeros(capacity, env.obs_dims.full), "action": torch.zeros(capacity, 2),
              "reward": torch.zeros(capacity), "next_obs": torch.zeros(capacity, env.obs_dims.full),
              "terminated": torch.zeros(capacity), "discount": torch.full((capacity,), cfg.gamma)}
    obs, stored = env.reset(seed=0), 0
    for _ in range(updates):
        if stored < warm_up:
            action = torch.rand((num_envs, 2), generator=generator) * 2 - 1
        else:
            action = sac.policy.act(obs, False, generator)
        step = env.step(action)
        rows = slice(stored, stored + num_envs)  # every row is valid: the task gives its final observations
        for name, value in (("obs", obs), ("action", action), ("reward", step.reward), ("next_obs", step.next_obs),
                            ("terminated", step.terminated.float())):
            replay[name][rows] = value
        stored, obs = stored + num_envs, step.obs
        picked = torch.randint(0, stored, (1, cfg.batch_size), generator=generator)
        sac.update(Batch(**{name: column[picked] for name, column in replay.items()}))

    evaluation = make_batched_env("torch", PointReach, 256, **GROUPS)
    obs = evaluation.reset(seed=123)
    for _ in range(100):  # one episode: every copy truncates at the last step
        step = evaluation.step(sac.policy.act(obs, True))
        obs = step.obs
    distance, ended = step.episode_info["distance"]
    assert ended.all()
    assert distance.mean() < 0.3, f"mean final distance {distance.mean():.3f}"
