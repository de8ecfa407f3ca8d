"""The batched path on aa-ray's torch task (issue 35, item 6): PointReach at 1k to 16k envs on the CPU.

For each env count, side by side in one process (one torch thread, as a runner actor has):
- `raw`: `PointReach.step` alone with uniform actions: the simulator, the hardware's own limit here;
- `adapter`: the same through `envs.batched.TorchBatchedAdapter` (groups laid out, the final
  observation picked where an episode ended);
- `runner random` / `runner policy`: `BatchedRunner.sample` (the `batched` runner kind), warm-up
  actions or SAC's 256x256 policy acting; what it hands the replay actor crosses to the host once
  per chunk;
- `device collect`: `DeviceLearner.iterate(learn=False)` (`runtime.mode: device`): policy acting, the
  ring on the device, no host copy of transitions;
- `device learn` (4k envs only by default): `DeviceLearner.iterate(learn=True)` at SAC's settings of
  `specs/sac_point_reach.yaml` scaled to the env count (batch 8192 at 4096 envs), where the
  iteration's time is split into the simulator's share (env steps x the raw cell's time per step),
  the learner's (`learner/update_time_s`) and the rest.

Reported: env steps/s (median, min, max over the alternating repetitions) and, for every contender
but `raw`, the share of its time spent outside the simulator, 1 - rate / raw rate (the rates of one
repetition were measured back to back).

Run from the repository root:
    .venv/bin/python benchmarks/bench_batched.py                   # 1k, 4k, 16k envs (~5 min on 2 cores)
    .venv/bin/python benchmarks/bench_batched.py --quick           # 256 envs, seconds (CI)
    .venv/bin/python benchmarks/bench_batched.py --envs 4096 --reps 5 --json benchmarks/results/batched.json
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from _common import (  # noqa: E402
    SPECS,
    alternate,
    base_parser,
    command_line,
    machine_info,
    print_machine,
    print_table,
    write_json,
)

from aa_ray import metric_names as m  # noqa: E402
from aa_ray.envs.batched import make_batched_env  # noqa: E402
from aa_ray.envs.make import env_dims  # noqa: E402
from aa_ray.envs.point_reach import PointReach  # noqa: E402
from aa_ray.runtime.batched_runner import BatchedRunner  # noqa: E402
from aa_ray.runtime.device_learner import DeviceLearner  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

STEPS_PER_CALL = 8  # a runner's chunk: algo.train_every


def spec_for(envs: int, device_mode: bool, *extra: str) -> Any:
    sets = [f"runners.envs_per_runner={envs}", "runtime.backend=inline", "tracking.enabled=false",
            f"algo.train_every={STEPS_PER_CALL}", "algo.warm_up_steps=0", "budget.stop_at=null",
            f"budget.env_steps={envs * 10_000}", *extra]
    if device_mode:
        sets.append("runtime.mode=device")
    return load_spec(SPECS / "sac_point_reach.yaml", sets)


def rate_of(step: Callable[[], int], calls: int) -> Callable[[], float]:
    """A contender for `alternate`: env steps per second over `calls` calls of `step` (which returns
    the env steps it made)."""

    def timed() -> float:
        start, done = time.perf_counter(), 0
        for _ in range(calls):
            done += step()
        return done / (time.perf_counter() - start)

    return timed


def contenders(envs: int, learn: bool, calls: int | None = None
               ) -> tuple[list[tuple[str, Callable[[], float]]], dict[str, Any]]:
    raw = PointReach(envs)
    raw.reset(seed=0)
    generator = torch.Generator().manual_seed(0)

    def raw_step() -> int:
        for _ in range(STEPS_PER_CALL):
            raw.step(torch.rand((envs, 2), generator=generator) * 2 - 1)
        return envs * STEPS_PER_CALL

    adapter = make_batched_env("torch", PointReach, envs, actor_obs=["policy"], critic_obs=["policy", "critic"])
    adapter.reset(seed=0)

    def adapter_step() -> int:
        for _ in range(STEPS_PER_CALL):
            adapter.step(torch.rand((envs, 2), generator=generator) * 2 - 1)
        return envs * STEPS_PER_CALL

    runner = BatchedRunner(spec_for(envs, False), index=0)
    obs, act_dim = env_dims(spec_for(envs, True))
    device = DeviceLearner(spec_for(envs, True), obs, act_dim)
    device.iterate(STEPS_PER_CALL, random_actions=True, learn=False)  # a ring with data, the policy made
    cells: list[tuple[str, Callable[[], int]]] = [
        ("raw", raw_step),
        ("adapter", adapter_step),
        ("runner random", lambda: runner.sample(STEPS_PER_CALL, random_actions=True)[1].env_steps),
        ("runner policy", lambda: runner.sample(STEPS_PER_CALL, random_actions=False)[1].env_steps),
        ("device collect", lambda: device.iterate(STEPS_PER_CALL, random_actions=False, learn=False)[0].env_steps),
    ]
    extra: dict[str, Any] = {}
    if learn:
        learner = DeviceLearner(spec_for(envs, True, f"algo.batch_size={2 * envs}", "algo.utd_ratio=1"), obs, act_dim)
        learner.iterate(STEPS_PER_CALL, random_actions=True, learn=False)
        update_s: list[float] = []

        def learn_step() -> int:
            stats, report = learner.iterate(STEPS_PER_CALL, random_actions=False, learn=True)
            update_s.append(report.metrics[m.LEARNER_UPDATE_TIME_S])
            return stats.env_steps

        cells.append(("device learn", learn_step))
        extra["update_s"] = update_s
    # calls per repetition: about a second of the slowest contender's work at this size
    calls = calls or max(2, int(2_000_000 / (envs * STEPS_PER_CALL * 20)))
    return [(name, rate_of(step, calls)) for name, step in cells], {**extra, "calls": calls}


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=5)
    parser.add_argument("--envs", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--learn-at", type=int, default=4096, help="the env count of the `device learn` cell")
    parser.add_argument("--quick", action="store_true", help="256 envs, 2 repetitions: a smoke run for CI")
    args = parser.parse_args()
    if args.quick:
        args.envs, args.reps, args.learn_at = [256], 2, 256
    if args.smoke:  # every cell once, 64 envs
        args.envs, args.reps, args.learn_at = [64], 1, 64
    torch.set_num_threads(1)
    info = machine_info()
    print_machine(info)
    rows, results = [], {}
    for envs in args.envs:
        print(f"## {envs} envs", flush=True)
        calls = 1 if args.smoke else 2 if args.quick else None
        cells, extra = contenders(envs, learn=envs == args.learn_at, calls=calls)
        rates = alternate(cells, args.reps)
        results[envs] = {"rates": rates, **extra}
        for name, values in rates.items():
            outside = "" if name == "raw" else statistics.median(
                1 - rate / raw for rate, raw in zip(values, rates["raw"], strict=True))
            rows.append([envs, name, statistics.median(values), min(values), max(values), outside])
        if "update_s" in extra:  # the learning iteration split: simulator, learner, the rest
            learn_rates, raw_rates = rates["device learn"], rates["raw"]
            calls, steps = extra["calls"], envs * STEPS_PER_CALL
            per_iteration = [1 / (rate / steps) for rate in learn_rates]  # wall s per iteration
            updates = extra["update_s"]
            simulator = [steps / raw for raw in raw_rates]
            learner = statistics.median(updates)
            busy = [min(1.0, (sim + learner) / wall) for sim, wall in zip(simulator, per_iteration, strict=True)]
            results[envs]["split"] = {"iteration_s": per_iteration, "simulator_s": simulator, "learner_s": learner,
                                      "busy_share": busy, "calls": calls}
            print(f"# device learn at {envs} envs: iteration {statistics.median(per_iteration) * 1e3:.1f} ms, "
                  f"simulator {statistics.median(simulator) * 1e3:.1f} ms, learner {learner * 1e3:.1f} ms: "
                  f"simulator + learner {statistics.median(busy):.1%} of the iteration", flush=True)
    print_table(["envs", "contender", "env steps/s", "min", "max", "outside the simulator"], rows)
    write_json(args.json, {"machine": info, "command": command_line(), "results": results})


if __name__ == "__main__":
    main()
