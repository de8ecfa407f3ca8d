"""Scaling out on a real local Ray: DDP learners (gloo), checkpoints across learner counts, sync-mode
async collection, runner restarts and fail-fast resource checks."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
import torch.distributed as dist
from mlflow.tracking import MlflowClient

from aa_ray.records import NormMoments, Transitions
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.cluster import ResourceError
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.trainer import IterationDone, Trainer
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL_SAC = ["algo.actor_hidden_dims=[32,32]",
    "algo.critic_hidden_dims=[32,32]", "algo.batch_size=64", "algo.warm_up_steps=200", "algo.train_every=5"]


def spec(*overrides: str, file: str = "sac.yaml"):
    return load_spec(SPECS / file, ["tracking.enabled=false", "checkpoint.save_replay=false", *overrides])


@pytest.fixture(scope="class")
def local_ray():
    # A Ray for TestOnOneRay's runs alone (each Ray start costs ~5 s of CPU on 2 cores), shut down before the
    # tests after it: after a module's Ray shared by earlier tests had been shut down, the killed-runner run
    # in this process once sat for minutes without env steps, and once ended the process.
    ray.init(address="local", num_cpus=6, include_dashboard=False)
    yield
    ray.shutdown()


def fixed_batches(
    rng: np.random.Generator, num_batches: int, batch_size: int, obs_dim: int, act_dim: int
) -> Transitions:
    shape = (num_batches, batch_size)
    terminated = (rng.random(shape) < 0.1).astype(np.float32)
    return Transitions(
        obs=rng.normal(size=(*shape, obs_dim)).astype(np.float32),
        action=rng.uniform(-1, 1, size=(*shape, act_dim)).astype(np.float32),
        reward=rng.normal(size=shape).astype(np.float32),
        next_obs=rng.normal(size=(*shape, obs_dim)).astype(np.float32),
        terminated=terminated, truncated=np.zeros_like(terminated),
        discount=np.full(shape, 0.99, np.float32),
    )


MLP = ["algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]"]
SIMBA = ["algo.critic_hidden_dim=32", "algo.actor_hidden_dim=16"]
SMALL_NETS = {  # spec file -> smaller networks, same algorithm (BEE's V, C51, SimbaV2's projections)
    "sac.yaml": MLP, "sac_bee.yaml": MLP, "sac_dist.yaml": [*MLP, "algo.num_atoms=21"], "td3.yaml": MLP,
    "sac_simba.yaml": SIMBA, "sac_dist_simba.yaml": [*SIMBA, "algo.num_atoms=21"],
    "crossq.yaml": [*MLP, "algo.renorm_warmup_steps=3"],  # batch renormalization's statistics, past warm-up
}


def test_the_rendezvous_listens_on_the_learner_node_address_only_on_a_port_it_holds() -> None:
    """Rank 0's store is bound to the address it is given (not every interface), on a port that
    was never released between choosing and listening, so two rendezvous never collide. (Plain
    Learners in this process: the store is torch's, no Ray is needed.)"""
    import psutil

    two = spec("learners.num_learners=2")
    first, second = Learner(two, 4, 2, rank=0), Learner(two, 4, 2, rank=0)
    addresses = [learner.rendezvous_address("127.0.0.1") for learner in (first, second)]
    assert addresses[0] != addresses[1]
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"}
    for address in addresses:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and ("127.0.0.1", int(port)) in listening
        assert ("0.0.0.0", int(port)) not in listening and ("::", int(port)) not in listening


@pytest.mark.usefixtures("local_ray")
class TestOnOneRay:
    """The runs that kill nothing, on one Ray for the class (each test starting its own cost a Ray
    start-up apiece); stopped before the tests below, which start their own."""

    def test_two_gloo_learners_stay_identical_and_match_one_learner(self) -> None:
        """Two DDP learners, each fed half of every global batch, end with identical models, equal
        (within float tolerance) to one learner fed the whole batches: gradient averaging, the
        explicitly synchronized normalizers and the sharded sampling noise all line up, in every
        variant of the family (one Ray and two rank processes for all of them: starting them costs
        more than a variant's check)."""

        class RankProcess:  # defined here so that Ray ships it by value: the workers cannot import this file
            """One rank's process, hosting that rank's Learner of each variant in turn (a new process
            costs ~3 CPU-s to import torch). A new variant's learner joins a new process group once the
            last one's is gone, as a restarted Learner actor would."""

            def start(self, spec: Any, obs_dim: int, act_dim: int, rank: int) -> None:
                if dist.is_initialized():
                    dist.destroy_process_group()
                self.learner = Learner(spec, obs_dim, act_dim, rank)

            def call(self, method: str, *args: Any) -> Any:
                return getattr(self.learner, method)(*args)

        ranks = [ray.remote(RankProcess).options(num_cpus=1).remote() for _ in range(2)]
        try:
            for algo_file in SMALL_NETS:
                check_two_gloo_learners_against_one(algo_file, ranks)
        finally:  # their CPUs back to the class's Ray, for the runs after this test
            for process in ranks:
                ray.kill(process)

    def test_checkpoints_move_between_one_and_two_learners(self, tmp_path: Path) -> None:
        """A run with L=2 checkpoints unwrapped state; L=1 resumes it (in async mode, refilling the
        replay the checkpoint did not keep) and the reverse. A resumed run continues in its run
        folder, so each stage reads its final checkpoint before the next. (One Ray for the three runs.)"""
        checkpoint, env_steps, gradient_updates = None, [], []
        for num_learners, budget, mode in [(2, 600, "sync"), (1, 900, "async"), (2, 1200, "sync")]:
            s = spec(*SMALL_SAC, f"learners.num_learners={num_learners}", f"budget.env_steps={budget}",
                     f"runtime.mode={mode}")
            payload = load_checkpoint(checkpoint) if checkpoint else None
            result = Trainer(s, run_dir=tmp_path / "run", resume=payload, live=False).run()
            checkpoint = Path(result.checkpoint)
            env_steps.append(result.env_steps)
            gradient_updates.append(load_checkpoint(checkpoint).learner.gradient_updates)
        assert [steps // 100 for steps in env_steps] == [6, 9, 12]  # each budget met (a chunk may overshoot)
        assert gradient_updates[0] < gradient_updates[1] < gradient_updates[2], gradient_updates  # each one trained on

    def test_more_cpus_than_the_cluster_has_fails_fast_naming_cpu(self) -> None:
        """On a running cluster (6 CPUs here) a spec needing more fails in seconds, naming CPU.
        (An embedded local Ray is sized to the spec instead: Ray accepts more CPUs than cores.)"""
        s = spec(*SMALL_SAC, "learners.num_learners=2", "learners.cpus_per_learner=4")
        start = time.monotonic()
        with pytest.raises(ResourceError, match="needs 9.5 CPU"):
            Trainer(s, live=False).run()
        assert time.monotonic() - start < 60


def check_two_gloo_learners_against_one(algo_file: str, ranks: list[Any]) -> None:
    overrides = [*SMALL_NETS[algo_file], "algo.batch_size=64", "algo.utd_ratio=2", "algo.normalize_obs=true"]
    one = spec(*overrides, file=algo_file)
    two = spec(*overrides, "learners.num_learners=2", file=algo_file)
    obs_dim, act_dim = 8, 2
    single = Learner(one, obs_dim, act_dim)
    ray.get([process.start.remote(two, obs_dim, act_dim, rank) for rank, process in enumerate(ranks)])
    address = ray.get(ranks[0].call.remote("rendezvous_address", ray.util.get_node_ip_address()))
    ray.get([process.call.remote("join", address) for process in ranks])

    rng = np.random.default_rng(0)
    for _ in range(6):
        samples = fixed_batches(rng, num_batches=2 * 3, batch_size=64, obs_dim=obs_dim, act_dim=act_dim)
        moments = NormMoments((64, rng.normal(size=obs_dim), rng.uniform(0.5, 2, obs_dim)), (64, 0.0, 1.0, 1.0))
        shards = [samples.take((slice(None), slice(r * 32, (r + 1) * 32))) for r in range(2)]
        single.update([moments], samples)
        ray.get([process.call.remote("update", [moments], shard) for process, shard in zip(ranks, shards, strict=True)])

    rank0, rank1 = ray.get([process.call.remote("parameters_vector") for process in ranks])
    states = [ray.get(process.call.remote("state_dict")).algo for process in ranks] + [single.state_dict().algo]
    reference = single.parameters_vector()
    if algo_file == "crossq.yaml":  # every batch-renormalization layer's running statistics, by name
        stats = [{f"{net}.{key}": value for net in ("policy", "critic") for key, value in state[net].items()
                  if "running_" in key} for state in states]
        first = stats[0]["critic.net.0.running_mean"]
        assert len(stats[0]) == 2 * (3 + 3) and first.abs().max() > 0  # (mean, var) of 3 layers each; they moved
        assert all(torch.equal(stats[0][key], stats[1][key]) for key in stats[0]), "the ranks' statistics differ"
        for key in stats[0]:
            np.testing.assert_allclose(stats[0][key].numpy(), stats[2][key].numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"{algo_file}: {key}")
    assert rank0.shape == rank1.shape == reference.shape, algo_file
    assert (rank0 == rank1).all(), f"{algo_file}: the two ranks diverged"
    np.testing.assert_allclose(rank0.numpy(), reference.numpy(), rtol=1e-4, atol=1e-5, err_msg=algo_file)
    untrained = Learner(one, obs_dim, act_dim).algo.policy_state()
    assert any(not (untrained[k] == v).all() for k, v in single.algo.policy_state().items()), algo_file  # it trained


def metric_history(run_id: str, key: str) -> list[float]:
    history = MlflowClient().get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))]


def kill_and_wait(actor: Any) -> None:
    """ray.kill `actor` and return once it is gone (a kill lands a moment after ray.kill returns)."""
    ray.kill(actor)
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_env_runners_are_replaced_and_the_run_finishes(mode: str) -> None:
    """ray.kill one of two runners mid-run: it is restarted in its bundle. Later the other is killed
    between two iterations and found gone first by a checkpoint's call for its state (CI once saw that
    with a lost node, whose actors answered for a while after their raylet ended): it is replaced the
    same way and the checkpoint holds its replacement's state, not taken for a lost learner. The run
    finishes its budget with no graph rebuilt, the restarts are in MLflow (metric and events.jsonl), and
    the replay never shrinks. In sync mode the runners are called through a fleet actor, which finds the
    dead one and calls its replacement; in async mode the killed runner's chunk in flight fails after its
    replacement started, and replaces nothing more."""
    fleet = ["runtime.fleet_actor_from=2"] if mode == "sync" else []  # async calls each runner from the driver
    s = load_spec(  # 20 env steps per runner per iteration, not 5: a quarter of the iterations to the budget
        SPECS / "sac.yaml",
        [*SMALL_SAC, "algo.train_every=20", "runners.num_runners=2", "budget.env_steps=1200", f"runtime.mode={mode}",
         "checkpoint.save_replay=false", "learners.torch_threads=2", *fleet],
    )
    trainer = Trainer(s, live=False)
    saved: list[Path] = []

    def kill_runner_0_then_checkpoint(done: IterationDone) -> None:
        if not saved and done.env_steps >= 900:
            doomed = trainer.runners[0]
            kill_and_wait(doomed)
            saved.append(trainer.save_checkpoint("runner_0_killed"))
            assert trainer.runners[0] is not doomed

    trainer.on_iteration.append(kill_runner_0_then_checkpoint)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = trainer.run()
        except Exception as err:  # what the user would see
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while trainer.counters.env_steps < 600 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trainer.counters.env_steps >= 600, "the run did not get going"
    # each actor's process has the torch thread count its spec section gives (the shell sets it)
    actors = (*trainer.learners, trainer.runners[0])
    assert ray.get([actor.__ray_call__.remote(lambda _: torch.get_num_threads()) for actor in actors]) == [2, 1]
    ray.kill(trainer.runners[1])
    thread.join(timeout=300)
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert saved and result.env_steps >= 1200
    assert (result.runner_restarts, result.graph_restarts) == (2, 0)
    assert len(load_checkpoint(saved[0]).runners) == 2

    run_id = result.mlflow_run_id
    assert metric_history(run_id, "runtime/runner_restarts")[-1] == 2.0
    sizes = metric_history(run_id, "replay/size")
    assert sizes == sorted(sizes) and sizes[-1] > 1000
    events = [json.loads(line) for line in (Path(result.run_dir) / "events.jsonl").read_text().splitlines()]
    assert sorted((e["event"], e["runner"]) for e in events) == [("runner_restart", 0), ("runner_restart", 1)]
    artifacts = {a.path for a in MlflowClient().list_artifacts(run_id)}
    assert "events.jsonl" in artifacts


def test_too_many_restarts_end_the_run_with_a_clear_error() -> None:
    s = load_spec(SPECS / "sac.yaml", [*SMALL_SAC, "runtime.max_runner_restarts=0", "tracking.enabled=false",
                                       "budget.env_steps=3000"])
    trainer = Trainer(s, live=False)
    errors: list[Exception] = []

    def run() -> None:
        try:
            trainer.run()
        except Exception as err:  # the error the user would see
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while trainer.counters.env_steps < 300:
        time.sleep(0.05)
    ray.kill(trainer.runners[0])
    thread.join(timeout=120)
    assert errors and "max_runner_restarts=0" in str(errors[0]) and "env runner 0" in str(errors[0])


def test_a_killed_learner_past_the_restart_limit_ends_the_run_naming_the_last_checkpoint(tmp_path: Path) -> None:
    """With no graph restarts allowed, a dead learner ends the run with a message that names the
    checkpoint to resume from (recovery itself is tested in test_reliability.py)."""
    s = spec(*SMALL_SAC, "budget.env_steps=5000", "checkpoint.every_env_steps=500", "runtime.max_learner_restarts=0")
    trainer = Trainer(s, run_dir=tmp_path / "run", live=False)
    errors: list[Exception] = []

    def run() -> None:
        try:
            trainer.run()
        except Exception as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while trainer.last_checkpoint is None:
        time.sleep(0.05)
    ray.kill(trainer.learners[0])
    thread.join(timeout=120)
    message = str(errors[0])
    assert "learner 0 died" in message and "max_learner_restarts=0" in message and "--resume" in message
    checkpoint = Path(message.split("--resume ")[1].split()[0])
    assert load_checkpoint(checkpoint).driver.counters.env_steps >= 500  # usable: it loads


@pytest.mark.learning
def test_async_sac_solves_pusher_reach_with_bounded_policy_lag() -> None:
    """Async mode learns: < 0.05 m mean eval distance within 20k env steps (measured 9k; sync SAC
    needs 8.5k at this width, tests/test_learning_rlpd.py),
    while no runner ever acts with weights more than `max_policy_lag` = 2 updates old and the
    learner keeps the UTD ratio (critic updates per fleet step) at the spec's value on average."""
    s = load_spec(
        SPECS / "sac.yaml",
        ["runtime.mode=async", "budget.stop_at_eval_distance=0.05", "checkpoint.save_replay=false",
         # 128 wide, as the in-process learning tests (tests/learning_runs.py)
         "algo.actor_hidden_dims=[128,128]", "algo.critic_hidden_dims=[128,128]", "algo.batch_size=128"],
    )
    result = Trainer(s, live=False).run()
    distances = [e["eval/distance"] for e in result.evals]
    assert result.stop_reason == "target reached", f"eval distances: {distances}"
    lags = metric_history(result.mlflow_run_id, "runtime/policy_lag_max")
    assert lags and max(lags) <= s.runtime.max_policy_lag
    utd = metric_history(result.mlflow_run_id, "runtime/updates_per_fleet_step")[-1]
    assert 0.8 * s.algo.utd_ratio <= utd <= 1.2 * s.algo.utd_ratio, utd
    print(f"async sac solved pusher-reach at {result.env_steps} env steps; lag max {max(lags)}; utd {utd:.2f}")
