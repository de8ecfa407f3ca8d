"""A learner iteration reads tensor values on the host a fixed number of times, however many fleet
steps (and gradient steps) it trains: the skip decisions, counters and diagnostics stay on the
device until one transfer at the end. On a GPU every host read is a device sync, so a read inside
the UTD loop would make the learner wait for the device once per gradient step."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import HostReads, random_transitions  # noqa: E402

from aa_ray.records import RolloutChunk  # noqa: E402
from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
OBS_DIM, ACT_DIM = 5, 2
MLP = ["algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]"]
SIMBA = ["algo.actor_hidden_dim=16", "algo.critic_hidden_dim=16", "algo.critic_num_blocks=1"]
OFF_POLICY = {  # spec -> small networks, every optional part of the update switched on
    "sac": [*MLP, "algo.max_grad_norm=1.0", "algo.normalize_reward=true"],
    "sac_bee": MLP,  # BAC's V step and the BEE target
    "sac_simba": SIMBA,  # weight projection after every step
    "sac_dist": [*MLP, "algo.num_atoms=11"],
    "sac_dist_simba": [*SIMBA, "algo.num_atoms=11"],
    "td3": MLP,
}


def reads_per_update(spec_name: str, overrides: list[str], fleet_steps: int) -> int:
    spec = load_spec(SPECS / f"{spec_name}.yaml", [*overrides, "algo.batch_size=16", "algo.utd_ratio=2",
                                                    f"algo.train_every={fleet_steps}"])
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    replay = ReplayBuffer(512, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(512, OBS_DIM, ACT_DIM))
    learner.update([], replay.sample(2 * fleet_steps, 16))  # first call: lazy optimizer state
    samples = replay.sample(2 * fleet_steps, 16)
    with HostReads() as reads:
        learner.update([], samples)
    return reads.count


@pytest.mark.parametrize("spec_name", list(OFF_POLICY))
def test_off_policy_host_reads_do_not_grow_with_fleet_steps(spec_name: str) -> None:
    one, many = (reads_per_update(spec_name, OFF_POLICY[spec_name], steps) for steps in (1, 5))
    assert one == many == 1, (one, many)  # the diagnostics' one transfer, nothing per gradient step


def rollout(steps: int, envs: int) -> RolloutChunk:
    rng = np.random.default_rng(0)
    columns = {key: rng.normal(size=(steps, envs)).astype(np.float32)
               for key in ("log_prob", "value", "reward", "next_value")}
    ended = np.zeros((steps, envs), np.float32)
    ended[steps // 2] = 1.0
    return RolloutChunk(
        obs=rng.normal(size=(steps, envs, OBS_DIM)).astype(np.float32),
        action=rng.normal(size=(steps, envs, ACT_DIM)).astype(np.float32),
        terminated=ended, truncated=ended[::-1].copy(), **columns,
    )


@pytest.mark.parametrize("desired_kl", ["null", "0.01"])  # the KL-adaptive lr moves on the device too
def test_ppo_host_reads_do_not_grow_with_fleet_steps_or_minibatches(desired_kl: str) -> None:
    def reads(steps: int, minibatches: int) -> int:
        spec = load_spec(SPECS / "ppo.yaml", [*MLP, f"algo.train_every={steps}", "algo.ppo_epochs=2",
                                              f"algo.num_minibatches={minibatches}", f"algo.desired_kl={desired_kl}"])
        learner = Learner(spec, OBS_DIM, ACT_DIM)
        learner.update([], rollout(steps, 4))
        with HostReads() as counted:
            learner.update([], rollout(steps, 4))
        return counted.count

    one, many = reads(4, 1), reads(16, 4)
    assert one == many == 1, (one, many)
