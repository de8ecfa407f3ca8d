"""Scaling out, as ratios measured side by side in one session on a real local Ray:

- fleet:  env-runner collection throughput on HalfCheetah-v5 with 1, 2 and 4 runners (E envs each,
          acting with a fixed untrained policy), relative to one runner;
- replay: global batches/s the replay actor serves through Ray (sampled, sharded for L learners and
          fetched) relative to the batches/s one learner consumes;
- ddp:    time per update with L=2 gloo learners vs L=1 at the same global batch;
- async:  wall-clock to a fixed env-step budget on pusher-reach, async vs sync, same spec and UTD;
- weights: a policy's weights put in the object store and read in a runner's process, as tensors and
          as the numpy arrays learner 0 publishes (`nets.policy.state_arrays`): CPU per put and per read.

Run:
    .venv/bin/python benchmarks/bench_scale_out.py --part fleet|replay|ddp|async [--reps N]
    .venv/bin/python benchmarks/bench_scale_out.py --part all                        # ~10 minutes
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SPECS,
    alternate,
    base_parser,
    machine_info,
    median_ratio,
    print_machine,
    print_table,
    random_transitions,
    write_json,
)

from aa_ray.algos.registry import build_policy  # noqa: E402
from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

OBS_DIM, ACT_DIM = 10, 2  # pusher-reach


def part_fleet(args) -> dict:
    from aa_ray.runtime.env_runner import EnvRunner

    spec = load_spec(SPECS / "sac.yaml", ["env.id=HalfCheetah-v5", f"runners.envs_per_runner={args.envs}"])
    policy = build_policy(spec.algo, 17, 6)
    weights = ray.put({k: v.detach() for k, v in policy.state_dict().items()})
    runner_cls = ray.remote(EnvRunner).options(num_cpus=1)
    # a fleet of r runners is the first r of one set (a runner keeps nothing between samples): fewer
    # actors to start, and every fleet size measured on the same processes
    runners = [runner_cls.remote(spec, i) for i in range(2 if args.smoke else 4)]
    fleets = {r: runners[:r] for r in ((1, 2) if args.smoke else (1, 2, 4))}
    ray.get([runner.set_weights.remote(weights, 1) for runner in runners])
    ray.get([runner.sample.options(num_returns=2).remote(20, False)[1] for runner in runners])  # warm up

    def collect(fleet: list) -> float:
        start = time.perf_counter()
        stats = ray.get([runner.sample.options(num_returns=2).remote(args.steps, False)[1] for runner in fleet])
        return sum(s.env_steps for s in stats) / (time.perf_counter() - start)

    rates = alternate([(f"{r} runner(s)", lambda f=fleet: collect(f)) for r, fleet in fleets.items()], args.reps)
    rows = [[name, statistics.median(r), median_ratio(rates, name, "1 runner(s)")] for name, r in rates.items()]
    print_table(["fleet", "env steps/s (median)", "vs 1 runner"], rows)
    return {"fleet": {name: {"rates": r, "ratio": row[2]} for (name, r), row in zip(rates.items(), rows, strict=True)}}


def part_replay(args) -> dict:
    spec = load_spec(SPECS / "sac.yaml", [])
    algo = spec.algo
    num_batches = algo.train_every * algo.utd_ratio
    replay = ray.remote(ReplayBuffer).options(num_cpus=0.5).remote(100_000, OBS_DIM, ACT_DIM, seed=0)
    ray.get(replay.add.remote(random_transitions(50_000, OBS_DIM, ACT_DIM)))
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    local = ReplayBuffer(100_000, OBS_DIM, ACT_DIM, seed=0)
    local.add(random_transitions(50_000, OBS_DIM, ACT_DIM))

    def served(shards: int) -> float:  # global batches/s, sampled by the actor and fetched by the driver
        calls = 20
        start = time.perf_counter()
        for _ in range(calls):
            if shards == 1:
                ray.get(replay.sample.remote(num_batches, algo.batch_size))
            else:
                ray.get(replay.sample_for_learners.options(num_returns=shards).remote(num_batches, algo.batch_size,
                                                                                       shards))
        return calls * num_batches / (time.perf_counter() - start)

    def consumed() -> float:  # batches/s one learner trains on
        samples = local.sample(num_batches, algo.batch_size)
        start = time.perf_counter()
        learner.update([], samples)
        return num_batches / (time.perf_counter() - start)

    rates = alternate(
        [
            ("learner consumes", consumed),
            ("replay serves L=1", lambda: served(1)),
            ("replay serves L=2", lambda: served(2)),
        ],
        args.reps,
    )
    rows = [[name, statistics.median(r), median_ratio(rates, name, "learner consumes")] for name, r in rates.items()]
    print_table(["path", "batches/s of 256 (median)", "vs one learner's consumption"], rows)
    return {"replay": {name: {"rates": r, "ratio": row[2]} for (name, r), row in zip(rates.items(), rows, strict=True)}}


def part_ddp(args) -> dict:
    overrides = ["algo.utd_ratio=1"]
    one = load_spec(SPECS / "sac.yaml", overrides)
    two = load_spec(SPECS / "sac.yaml", [*overrides, "learners.num_learners=2"])
    remote = ray.remote(Learner).options(num_cpus=1)
    single = remote.remote(one, OBS_DIM, ACT_DIM)
    pair = [remote.remote(two, OBS_DIM, ACT_DIM, rank) for rank in range(2)]
    address = ray.get(pair[0].rendezvous_address.remote(ray.util.get_node_ip_address()))
    ray.get([learner.join.remote(address) for learner in pair])
    local = ReplayBuffer(100_000, OBS_DIM, ACT_DIM, seed=0)
    local.add(random_transitions(50_000, OBS_DIM, ACT_DIM))
    batch = one.algo.batch_size
    whole = ray.put(local.sample(args.updates, batch))
    halves = [ray.put(local.sample(args.updates, batch // 2)) for _ in range(2)]

    def updates_per_s(learners: list, samples: list) -> float:
        start = time.perf_counter()
        ray.get([learner.update.remote([], s) for learner, s in zip(learners, samples, strict=True)])
        return args.updates / (time.perf_counter() - start)

    updates_per_s([single], [whole])
    updates_per_s(pair, halves)  # warm up both
    rates = alternate(
        [("L=1", lambda: updates_per_s([single], [whole])), ("L=2 gloo", lambda: updates_per_s(pair, halves))],
        args.reps,
    )
    ratio = median_ratio(rates, "L=2 gloo", "L=1")
    print_table(
        ["learners", "updates/s at global batch 256 (median)", "vs L=1"],
        [[name, statistics.median(r), median_ratio(rates, name, "L=1")] for name, r in rates.items()],
    )
    return {"ddp": {"rates": rates, "ratio_L2_vs_L1": ratio}}


def part_async(args) -> dict:
    from aa_ray.runtime.trainer import Trainer

    def run(mode: str) -> float:
        spec = load_spec(
            SPECS / "sac.yaml",
            [
                f"runtime.mode={mode}", f"budget.env_steps={args.env_steps}",
                f"runners.num_runners={1 if args.smoke else 2}",
                "tracking.enabled=false", "checkpoint.save_replay=false", "checkpoint.every_env_steps=null",
                f"eval.every_env_steps={args.env_steps}", "runtime.output_dir=/tmp/aa_ray_bench_scale_out",
                # the spec's warm-up of 1000 is above the smoke budget; one evaluation episode of its ten shows the path
                *(["algo.warm_up_steps=100", "eval.episodes=1"] if args.smoke else []),
            ],
        )
        start = time.perf_counter()
        Trainer(spec, live=False).run()
        return args.env_steps / (time.perf_counter() - start)  # env steps/s, so higher is better

    rates = alternate([("sync", lambda: run("sync")), ("async", lambda: run("async"))], args.reps)
    ratio = median_ratio(rates, "async", "sync")
    print_table(
        ["mode", f"env steps/s to {args.env_steps} steps (median)", "vs sync"],
        [[name, statistics.median(r), median_ratio(rates, name, "sync")] for name, r in rates.items()],
    )
    return {"async": {"rates": rates, "speedup_async_vs_sync": ratio}}


def part_weights(args) -> dict:
    from aa_ray.nets.policy import state_arrays

    @ray.remote(num_cpus=1)
    class Reader:  # reads each of the refs once, as a runner reads the weights its sample call names
        def read(self, boxed: list) -> float:
            start = time.process_time()
            for ref in boxed:
                ray.get(ref)
            return (time.process_time() - start) / len(boxed)

    reader = Reader.remote()
    calls = 4 if args.smoke else 50
    results, rows = {}, []
    for algo in ("sac", "sac_simba"):
        spec = load_spec(SPECS / f"{algo}.yaml", [])
        state = {k: v.detach().clone() for k, v in build_policy(spec.algo, 17, 6).state_dict().items()}
        forms = {"tensors": state, "numpy arrays": state_arrays(state)}

        def put_and_read(weights: dict) -> tuple[float, float]:
            start = time.process_time()
            refs = [ray.put(weights) for _ in range(calls)]
            put = (time.process_time() - start) / calls
            return put, ray.get(reader.read.remote(refs))

        for weights in forms.values():  # warm up both paths
            put_and_read(weights)
        times = {form: [] for form in forms}
        for _ in range(args.reps):
            for form, weights in forms.items():
                times[form].append(put_and_read(weights))
        size = sum(v.numel() * v.element_size() for v in state.values())
        cell = {}
        for form, pairs in times.items():
            cell[form] = {"put_ms": statistics.median(p for p, _ in pairs) * 1e3,
                          "read_ms": statistics.median(r for _, r in pairs) * 1e3}
        cell["put_ratio"] = cell["tensors"]["put_ms"] / cell["numpy arrays"]["put_ms"]
        cell["read_ratio"] = cell["tensors"]["read_ms"] / cell["numpy arrays"]["read_ms"]
        results[algo] = {"bytes": size, **cell}
        tensors, arrays = cell["tensors"], cell["numpy arrays"]
        rows.append([f"{algo} ({size / 1e3:.0f} kB)", tensors["put_ms"], arrays["put_ms"], cell["put_ratio"],
                     tensors["read_ms"], arrays["read_ms"], cell["read_ratio"]])
    print_table(["policy", "put ms, tensors", "numpy", "ratio", "read ms, tensors", "numpy", "ratio"], rows)
    return {"weights": results}


def main() -> None:
    parser = base_parser(__doc__, reps=5)
    parser.add_argument("--part", choices=["fleet", "replay", "ddp", "async", "weights", "all"], default="all")
    parser.add_argument("--envs", type=int, default=4, help="fleet: envs per runner")
    parser.add_argument("--steps", type=int, default=250, help="fleet: steps per runner per repetition")
    parser.add_argument("--updates", type=int, default=40, help="ddp: updates per timed repetition")
    parser.add_argument("--env-steps", type=int, default=6000, help="async: env-step budget per run")
    args = parser.parse_args()
    if args.smoke:  # every part once, at the smallest sizes; fleets of 1 and 2 runners, async with one runner
        # and five learner iterations after the warm-up
        args.part, args.reps, args.steps, args.updates, args.env_steps = "all", 1, 20, 2, 150
    info = machine_info()
    print_machine(info)
    parts = ["fleet", "replay", "ddp", "async", "weights"] if args.part == "all" else [args.part]
    # smoke: without the idle workers Ray starts for the first driver (as aa_ray.runtime.cluster.connect
    # starts Ray): no actor uses them, and they cost a second of CPU
    system_config = {"prestart_worker_first_driver": False} if args.smoke else None
    ray.init(address="local", num_cpus=8, include_dashboard=False, _system_config=system_config)
    results = {}
    try:
        for part in parts:
            print(f"## {part}", flush=True)
            results |= globals()[f"part_{part}"](args)
    finally:
        ray.shutdown()
    write_json(args.json, {"machine": info, **results})


if __name__ == "__main__":
    main()
