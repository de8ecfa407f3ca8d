"""runtime.mode device: the env, a replay ring and the learner in one process on one device
(aa_ray/runtime/device_replay.py, device_learner.py, device_loop.py). On the CPU here, with PointReach,
aa-ray's own torch batched task: the ring's n-step windows against a hand-computed case, that an
iteration copies no observation, action or transition to the host and reads the host once, a
bit-exact resume, two learner processes over gloo kept in step. Learning in device mode is
tests/test_learning_fast_recipes.py's (FastTD3 on 1024 copies, specs/fasttd3_point_reach.yaml)."""

from __future__ import annotations

import io
import multiprocessing
import queue
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from aa_ray.envs.batched import BatchedStep
from aa_ray.envs.make import env_dims
from aa_ray.envs.point_reach import PointReach
from aa_ray.errors import SpecError
from aa_ray.records import LearnerState
from aa_ray.runtime.device_learner import DeviceLearner
from aa_ray.runtime.device_loop import DeviceLoop
from aa_ray.runtime.device_replay import DeviceReplay, ReplayShapeError
from aa_ray.runtime.inline import InlineActors
from aa_ray.spec.loader import validate_spec

# sizes no network weight has, so that a tensor of env rows or batch rows is recognized wherever it goes
ENVS, BATCH = 37, 29


def raw_spec(**changes: Any) -> dict[str, Any]:
    """A small device-mode run on PointReach; `changes` replace whole sections' keys (section__key=value)."""
    raw: dict[str, Any] = {
        "name": "device_path", "seed": 3,
        "env": {"id": "PointReach", "entry_point": "aa_ray.envs.point_reach:PointReach", "batched": "torch",
                "device": "cpu", "max_episode_steps": 6},
        "algo": {"name": "sac", "actor_obs": ["policy"], "critic_obs": ["policy", "critic"], "warm_up_steps": 2 * ENVS,
                 "train_every": 2, "utd_ratio": 2, "batch_size": BATCH, "buffer_size": 40 * ENVS, "n_step": 3,
                 "actor_hidden_dims": [16], "critic_hidden_dims": [16], "normalize_obs": True,
                 "normalize_reward": True},
        "runners": {"envs_per_runner": ENVS},
        "runtime": {"mode": "device", "backend": "inline"},
        "budget": {"env_steps": 100_000},
        "tracking": {"enabled": False},
    }
    for key, value in changes.items():
        section, field = key.split("__")
        raw[section][field] = value
    return raw


def device_learner(rank: int = 0, **changes: Any) -> DeviceLearner:
    spec = validate_spec(raw_spec(**changes))
    return DeviceLearner(spec, *env_dims(spec), rank=rank)


# ---- the ring ---------------------------------------------------------------------------------------
def step_of(reward: list[float], terminated: list[bool], truncated: list[bool], next_id: list[float],
            valid: list[bool] | None = None) -> BatchedStep:
    envs = len(reward)
    next_obs = torch.tensor(next_id, dtype=torch.float32).reshape(envs, 1)
    return BatchedStep(obs=next_obs, next_obs=next_obs, reward=torch.tensor(reward),
                       terminated=torch.tensor(terminated), truncated=torch.tensor(truncated),
                       valid=torch.tensor(valid if valid is not None else [True] * envs))


def drawn(replay: DeviceReplay, rows: int = 4500) -> dict[int, tuple[float, float, float, float]]:
    """Every distinct row a large sample drew: obs id -> (return, next_obs id, terminated, discount)."""
    batch = replay.sample(1, rows, torch.Generator().manual_seed(0))
    _, times = batch.obs.unique(return_counts=True)
    expected = rows / len(times)  # uniform over the drawable rows: each within 5 standard deviations
    assert (times - expected).abs().max() < 5 * expected**0.5, times
    out = {}
    for obs, reward, next_obs, terminated, discount in zip(
            batch.obs[0, :, 0].tolist(), batch.reward[0].tolist(), batch.next_obs[0, :, 0].tolist(),
            batch.terminated[0].tolist(), batch.discount[0].tolist(), strict=True):
        out[int(obs)] = (round(reward, 6), next_obs, terminated, round(discount, 6))
    return out


def test_ring_n_step_windows_stop_at_terminations_truncations_and_rows_that_are_no_transitions() -> None:
    """Two env columns, n = 3, gamma = 0.5. Observation ids are 10 * step + env; rewards 1, 2, 4, ...
    Env 0 terminates at step 1 and is truncated at step 4; env 1's row 3 is no transition (a reset row)."""
    replay = DeviceReplay(capacity_steps=8, num_envs=2, obs_dim=1, act_dim=1, device="cpu", n_step=3, gamma=0.5)
    F, T = False, True
    plan = [  # (rewards, terminated, truncated, valid) per step, for env 0 and env 1
        ([1, 10], [F, F], [F, F], [T, T]),
        ([2, 20], [T, F], [F, F], [T, T]),
        ([4, 40], [F, F], [F, F], [T, T]),
        ([8, 80], [F, F], [F, T], [T, F]),
        ([16, 160], [F, F], [T, F], [T, T]),
        ([32, 320], [F, F], [F, F], [T, T]),
        ([64, 640], [F, F], [F, F], [T, T]),
    ]
    for t, (reward, terminated, truncated, valid) in enumerate(plan):
        obs = torch.tensor([[10.0 * t], [10.0 * t + 1]])
        # next_obs ids: 100 + the id of the step's own obs (the true next observation)
        replay.add(obs, torch.zeros(2, 1), step_of(reward, terminated, truncated, [100 + 10 * t, 101 + 10 * t], valid))
    rows = drawn(replay)
    expected = {
        # env 0: step 0 runs into the termination at step 1: 1 + 0.5 * 2, no bootstrap
        0: (2.0, 110.0, 1.0, 0.25),
        10: (2.0, 110.0, 1.0, 0.5),  # the terminal step itself
        20: (4 + 0.5 * 8 + 0.25 * 16, 140.0, 0.0, 0.125),  # ends at the truncation (step 4): bootstrapped
        30: (8 + 0.5 * 16, 140.0, 0.0, 0.25),
        40: (16.0, 140.0, 0.0, 0.5),  # the truncated step: its true final observation, bootstrapped
        # env 1: step 0's window is whole; steps 1 and 2 stop before the row that is no transition
        1: (10 + 0.5 * 20 + 0.25 * 40, 121.0, 0.0, 0.125),
        11: (20 + 0.5 * 40, 121.0, 0.0, 0.25),
        21: (40.0, 121.0, 0.0, 0.5),
        41: (160 + 0.5 * 320 + 0.25 * 640, 161.0, 0.0, 0.125),
    }
    # row 31 is no transition; steps 5 and 6 wait for the steps their windows need
    assert rows == expected  # powers of two: exact
    assert int(replay.size) == len(expected)


def test_ring_wraps_and_a_restored_ring_samples_the_same_rows() -> None:
    replay = DeviceReplay(capacity_steps=4, num_envs=3, obs_dim=2, act_dim=1, device="cpu", n_step=2, gamma=0.9)
    generator = torch.Generator().manual_seed(1)
    for t in range(7):  # wraps: slots hold steps 3..6
        obs = torch.full((3, 2), float(t))
        replay.add(obs, torch.randn(3, 1, generator=generator),
                   step_of([float(t)] * 3, [False] * 3, [t == 5] * 3, [t + 1.0] * 3))
    batch = replay.sample(2, 50, torch.Generator().manual_seed(5))
    assert set(batch.obs[..., 0].unique().tolist()) == {3.0, 4.0, 5.0}  # step 6 waits for its successor
    assert int(replay.size) == 9

    restored = DeviceReplay(capacity_steps=4, num_envs=3, obs_dim=2, act_dim=1, device="cpu", n_step=2, gamma=0.9)
    restored.load_state_dict(replay.state_dict())
    again = restored.sample(2, 50, torch.Generator().manual_seed(5))
    for field, same in zip(batch, again, strict=True):
        assert torch.equal(field, same)

    other = DeviceReplay(capacity_steps=4, num_envs=5, obs_dim=2, act_dim=1, device="cpu", n_step=2, gamma=0.9)
    with pytest.raises(ReplayShapeError, match="runners.envs_per_runner"):
        other.load_state_dict(replay.state_dict())


# ---- what an iteration reads and copies -------------------------------------------------------------
class HostTraffic(TorchFunctionMode):
    """Counts, while active, values read on the host (`.item()`, `.tolist()`, `float(t)`, `bool(t)`, ...)
    and copies between tensors and host arrays (`.numpy()`, `.cpu()`, `np.asarray(t)`, `torch.from_numpy`,
    `torch.tensor` / `torch.as_tensor` of host data), and which of those carried env or batch rows."""

    READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__"})
    TO_HOST = frozenset({"numpy", "cpu", "__array__"})
    FROM_HOST = frozenset({"tensor", "as_tensor"})

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.copies: list[tuple[str, tuple[int, ...]]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if name in self.READS:
            self.reads.append(name)
        elif name in self.TO_HOST or (name == "to" and _to_cpu(args, kwargs or {})):
            self.copies.append((name, tuple(first.shape)))
        elif name in self.FROM_HOST and isinstance(first, np.ndarray | list):
            self.copies.append((name, np.shape(first)))
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostTraffic:
        super().__enter__()
        self._from_numpy = torch.from_numpy

        def counted(array: np.ndarray) -> torch.Tensor:
            self.copies.append(("from_numpy", array.shape))
            return self._from_numpy(array)

        torch.from_numpy = counted
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.from_numpy = self._from_numpy
        super().__exit__(*exc)

    def row_copies(self) -> list[tuple[str, tuple[int, ...]]]:
        """Copies of tensors with env rows or batch rows: observations, actions, transitions."""
        return [(name, shape) for name, shape in self.copies if ENVS in shape or BATCH in shape]


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    """`.to("cpu")`: asked for the host by name. (`.to(device)` with the run's device, the CPU here, is a
    move to the env's or learner's device, which on a GPU run is that GPU.)"""
    return any(isinstance(target, str) and target.startswith("cpu") for target in [*args[1:], kwargs.get("device")])


@pytest.mark.parametrize("algo", ["sac", "td3", "fast_td3", "fast_sac"])
def test_an_iteration_copies_no_rows_to_the_host_and_reads_it_once(algo: str) -> None:
    learner = device_learner(algo__name=algo)
    counts = []
    for iteration, (random_actions, learn) in enumerate([(True, False), (True, False), (False, True), (False, True)]):
        with HostTraffic() as traffic:
            stats, report = learner.iterate(2, random_actions, learn)
        counts.append((len(traffic.reads), traffic.copies))
        assert traffic.row_copies() == [], (iteration, traffic.row_copies())
        assert (report is not None) == learn
    # warm-up and learning alike: nothing moves to or from the host but the one read at the end. (The
    # acting module's refresh copies the policy's weights, never rows: `Learner.policy_state`.)
    assert [reads for reads, _ in counts] == [1, 1, 1, 1], counts
    assert all(copies == [] for _, copies in counts[:2]), counts
    assert learner.replay_size() > 0 and report.updates == 2 * 2


def test_a_resumed_device_learner_repeats_the_uninterrupted_one() -> None:
    """Learner, env, episode counters, random streams and the ring saved after three iterations: a new
    process loaded from them continues bit for bit (PointReach gives its state)."""
    first = device_learner()
    for iteration in range(3):
        first.iterate(2, iteration == 0, iteration > 0)
    # the learner's record as the checkpoint file holds it (its fields as a dict: plain types only)
    saved = checkpointed((first.state_dict()._asdict(), first.runner_state(with_replay=True)))
    assert saved[1]["env_restarts"] is False
    second = device_learner()
    second.load_state_dict(LearnerState(**saved[0]))
    second.load_runner_state(saved[1])
    for _ in range(3):
        (stats_a, report_a), (stats_b, report_b) = first.iterate(2, False, True), second.iterate(2, False, True)
        assert stats_a.episodes == stats_b.episodes and stats_a.env_steps == stats_b.env_steps
        assert _untimed(report_a.metrics) == _untimed(report_b.metrics)
    assert torch.equal(first.parameters_vector(), second.parameters_vector())
    assert first.replay_size() == second.replay_size()


def checkpointed(state: Any) -> Any:
    """`state` written and read back as a checkpoint's state.pt is (torch.load with weights_only)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _untimed(metrics: dict[str, float]) -> dict[str, float]:
    return {name: value for name, value in metrics.items() if not name.endswith(("_s", "per_s"))}


class StatelessReach:
    """PointReach behind an object that cannot give its state (as many simulators cannot)."""

    def __init__(self, num_envs: int, device: str = "cpu", **kwargs: Any):
        self.task = PointReach(num_envs, device, **kwargs)
        self.num_envs, self.device = num_envs, self.task.device
        self.observation_space, self.action_space = self.task.observation_space, self.task.action_space
        self.metadata = self.task.metadata

    def reset(self, seed: int | None = None) -> Any:
        return self.task.reset(seed)

    def step(self, actions: torch.Tensor) -> Any:
        return self.task.step(actions)


def test_a_resume_without_the_env_state_restarts_episodes_and_keeps_n_step_windows_apart() -> None:
    first = device_learner(env__entry_point=StatelessReach, env__max_episode_steps=50)
    for _ in range(2):
        first.iterate(3, True, False)
    state = checkpointed(first.runner_state(with_replay=True))
    assert state["env_restarts"] is True and state["env"] is None
    second = device_learner(env__entry_point=StatelessReach, env__max_episode_steps=50)
    second.load_runner_state(state)
    # the newest slice ends every episode (bootstrapped from its true next observation): no window
    # reaches from the old episodes into the ones the new process starts
    newest = (second.replay.cursor - 1) % second.replay.capacity
    assert bool(second.replay.truncated[newest].all()) and not bool(first.replay.truncated[newest].any())
    stats, _ = second.iterate(2, True, False)
    assert stats.env_steps == 2 * ENVS and second.replay_size() == first.replay_size() + 2 * ENVS


def test_a_checkpoint_of_another_env_count_is_refused_naming_the_field() -> None:
    state = device_learner().runner_state(with_replay=False)
    with pytest.raises(SpecError, match="runners.envs_per_runner"):
        device_learner(runners__envs_per_runner=ENVS + 1).load_runner_state(state)


def test_an_env_whose_dims_differ_from_the_drivers_is_refused() -> None:
    spec = validate_spec(raw_spec())
    obs, act_dim = env_dims(spec)
    with pytest.raises(SpecError, match="same version of the env's code"):
        DeviceLearner(spec, obs._replace(full=obs.full + 1), act_dim)


# ---- the loop ---------------------------------------------------------------------------------------
def test_the_device_loop_warms_up_then_learns_and_evaluates_through_inline_shells() -> None:
    spec = validate_spec(raw_spec())
    shell = InlineActors().start(DeviceLearner, spec, *env_dims(spec), 0, bundle=0, num_cpus=1.0, torch_threads=1)
    graph = SimpleNamespace(learners=[shell], runners=[], replay=None, replay_size=0)
    loop = DeviceLoop(spec, graph, env_steps=0)
    iterations = [loop.step() for _ in range(4)]
    assert [it.env_steps for it in iterations] == [2 * ENVS] * 4
    assert [it.learner is not None for it in iterations] == [False, False, True, True]  # warm_up_steps = 2 x ENVS
    assert iterations[-1].updates == 2 * 2 and graph.replay_size == shell.instance.replay_size() > 0
    assert sum(len(it.episodes) for it in iterations) == ENVS  # 8 steps of 6-step episodes: one each
    evaluation = shell.instance.evaluate(5)
    assert evaluation["eval/length"] == 6.0 and {"eval/return", "eval/distance", "eval/success"} <= set(evaluation)


# ---- two learner processes over gloo ------------------------------------------------------------------
def _rank(rank: int, raw: dict[str, Any], addresses: Any, results: Any) -> None:
    torch.set_num_threads(1)
    spec = validate_spec(raw)
    learner = DeviceLearner(spec, *env_dims(spec), rank=rank)
    if rank == 0:
        address = learner.rendezvous_address("127.0.0.1")
        addresses.put(address)
    else:
        address = addresses.get(timeout=120)
    learner.join(address)
    initial = learner.parameters_vector().numpy()  # numpy: a tensor would cross in shared memory this process frees
    returns = []
    for iteration in range(4):
        stats, _ = learner.iterate(2, iteration < 2, iteration >= 2)
        returns += [episode.episode_return for episode in stats.episodes]
    results.put((rank, initial, learner.parameters_vector().numpy(), returns))


def test_two_device_learners_over_gloo_stay_in_step() -> None:
    """Each process steps its own envs (other seeds, other episodes) into its own ring; DDP averages the
    gradients and the normalizers merge every rank's moments, so the networks stay equal."""
    raw = raw_spec(runners__num_runners=2, runtime__backend="ray", algo__batch_size=2 * BATCH)  # BATCH per rank
    raw["learners"] = {"num_learners": 2, "collective_timeout_s": 60}
    context = multiprocessing.get_context("spawn")
    addresses, results = context.Queue(), context.Queue()
    processes = [context.Process(target=_rank, args=(rank, raw, addresses, results)) for rank in range(2)]
    for process in processes:
        process.start()
    got: dict[int, tuple[np.ndarray, np.ndarray, list[float]]] = {}
    deadline = time.monotonic() + 150
    try:
        while len(got) < 2:
            try:
                rank, initial, final, returns = results.get(timeout=1)
                got[rank] = (initial, final, returns)
            except queue.Empty:
                failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    pytest.fail(f"a learner process failed or hung (exit codes {[p.exitcode for p in processes]})")
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert np.array_equal(got[0][1], got[1][1]), "the two learners diverged"
    assert not np.array_equal(got[0][0], got[0][1]), "nothing was learned"
    assert got[0][2] != got[1][2], "both ranks stepped the same episodes"


# ---- learning -----------------------------------------------------------------------------------------
