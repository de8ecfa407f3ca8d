"""How much memory a run's env copies will take, estimated before anything starts (issue 56).

A robot task's copies are heavy where each holds its own simulator (EnvPool's Go1: about 50 MiB a copy),
and a runner that outgrows the machine is killed by Ray's memory monitor minutes into a run. So before a
run starts, a child process makes the spec's env three times, with 2, 2 and 10 copies, and reads its
resident memory after each: the second env's growth is an env's fixed part plus 2 copies, the third's
the fixed part plus 10, which gives both (the first env pays the imports and is left out). The estimate
is every runner's training env and evaluation env, their copies, and the replay (or PPO's rollout) at
its full size; a spec whose estimate exceeds `FRACTION` of the memory available here is refused with
the estimate and the largest `runners.envs_per_runner` that fits.

Only the batched sources whose copies are each a simulator are measured (`MEASURED_SOURCES`), and only
for runs of at least `MIN_COPIES` copies: fewer fit any machine aa-ray runs on, and a measurement costs
seconds. A run on a Ray cluster (`RAY_ADDRESS` set) is not measured: its runners' memory is elsewhere.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aa_ray.errors import SpecError

if TYPE_CHECKING:
    from aa_ray.spec.experiment import ExperimentSpec

MEASURED_SOURCES = ("envpool", "unilab")
MIN_COPIES = 64
FRACTION = 0.85  # of the available memory: what the rest of the process, Ray and the learner need is not measured
PROBE_COPIES = (2, 2, 10)
FLOAT_BYTES = 4
PROBE = """
import json, sys, psutil, torch
from aa_ray.envs.make import make_batched_env
from aa_ray.spec.experiment import ExperimentSpec
spec = ExperimentSpec.model_validate_json(sys.stdin.read())
process, sizes, made = psutil.Process(), [], []
for copies in map(int, sys.argv[1:]):
    envs = make_batched_env(spec, copies, show_model_warnings=False)
    envs.reset(seed=spec.seed)
    for _ in range(3):
        envs.step(torch.zeros(envs.num_envs, envs.act_dim))
    made.append(envs)
    sizes.append(process.memory_info().rss)
print(json.dumps({"rss": sizes, "obs": envs.obs_dims.full, "act": envs.act_dim}))
"""


@dataclass(frozen=True)
class MemoryEstimate:
    per_copy: int  # bytes a copy adds
    per_env: int  # bytes a made env adds whatever its copies
    copies: int  # the run's copies, evaluation's included
    envs: int  # the run's made envs
    replay: int  # the replay at its full size (off-policy)
    rollout_per_copy: int  # PPO's rollout, per training copy (on-policy)
    training_copies: int
    available: int

    @property
    def total(self) -> int:
        return (self.per_copy * self.copies + self.per_env * self.envs + self.replay
                + self.rollout_per_copy * self.training_copies)

    @property
    def fits(self) -> bool:
        return self.total <= FRACTION * self.available


def available_memory() -> int | None:
    """Bytes this machine can give without swapping (psutil's `available`), None where unknown."""
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def measure(spec: ExperimentSpec) -> tuple[int, int, int, int]:
    """(bytes a copy adds, bytes an env adds, observation features, action size) of the spec's env,
    measured in a child process, once per env section and process (`validate` then `run`, or a
    spec loaded again with another count, measure once). SpecError when the env cannot be made there."""
    one_copy = spec.model_copy(update={"runners": spec.runners.model_copy(update={"envs_per_runner": 1})})
    return _measured(one_copy.model_dump_json())


@functools.lru_cache(maxsize=8)
def _measured(spec_json: str) -> tuple[int, int, int, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, PROBE_COPIES)], input=spec_json,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecError(f"env: measuring the memory of the env's copies before the run failed: {tail}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    first, second, third = found["rss"]
    _, second_size, third_size = PROBE_COPIES
    with_two = second - first  # an env's fixed part and 2 copies
    with_ten = third - second  # the fixed part and 10 copies
    per_copy = max(0, (with_ten - with_two) // (third_size - second_size))
    per_env = max(0, with_two - second_size * per_copy)
    return per_copy, per_env, int(found["obs"]), int(found["act"])


def estimate(spec: ExperimentSpec) -> MemoryEstimate | None:
    """The spec's estimate on this machine, or None where it is not measured (see the module's docstring)."""
    runners = spec.runners.num_runners
    copies = runners * spec.runners.envs_per_runner + spec.eval.episodes
    if spec.env.batched not in MEASURED_SOURCES or copies < MIN_COPIES or os.environ.get("RAY_ADDRESS"):
        return None
    available = available_memory()
    if available is None:
        return None
    per_copy, per_env, obs, act = measure(spec)
    row = (2 * obs + act + 4) * FLOAT_BYTES  # a transition: obs, next obs, action, reward, flags
    buffer_size = getattr(spec.algo, "buffer_size", None)
    return MemoryEstimate(
        per_copy=per_copy, per_env=per_env, copies=copies, envs=2 * runners,
        replay=0 if buffer_size is None else buffer_size * row,
        rollout_per_copy=0 if buffer_size is not None else spec.algo.train_every * row,
        training_copies=runners * spec.runners.envs_per_runner, available=available)


def check_memory(spec: ExperimentSpec) -> None:
    """SpecError, with the estimate and the largest runners.envs_per_runner that fits, when the spec's
    env copies would not fit this machine."""
    found = estimate(spec)
    if found is None or found.fits:
        return
    runners = spec.runners.num_runners
    room = FRACTION * found.available - found.per_env * found.envs - found.replay - found.per_copy * spec.eval.episodes
    largest = int(room // max(1, (found.per_copy + found.rollout_per_copy) * runners))
    mib = 2**20
    advice = (f"at most {largest} copies per runner fit (runners.envs_per_runner: {largest})" if largest > 0 else
              "no count of copies fits beside the rest (lower algo.buffer_size or eval.episodes, or add memory)")
    raise SpecError(
        f"runners.envs_per_runner: {runners} runner(s) x {spec.runners.envs_per_runner} copies of {spec.env.id} "
        f"(and {spec.eval.episodes} for evaluation) would take about {found.total / 2**30:.1f} GiB: "
        f"{found.per_copy / mib:.1f} MiB a copy and {found.per_env / mib:.0f} MiB an env, measured here, plus "
        f"{(found.replay + found.rollout_per_copy * found.training_copies) / mib:.0f} MiB of transitions; this "
        f"machine has {found.available / 2**30:.1f} GiB available and a run may use {FRACTION:.0%} of it: {advice}; "
        "on a Ray cluster, more runners on more nodes share the copies."
    )
