"""What starting a run's processes costs in CPU: a Ray worker with and without a runtime env, and the
imports of each aa-ray actor's module in a fresh interpreter.

    .venv/bin/python benchmarks/bench_actor_start.py --reps 5 --json out.json

Two measures, each a median over alternating repetitions (benchmarks/_common.py's `alternate`):

- **workers**: an embedded Ray per contender (started and stopped in a child process, so each
  repetition starts clean); after it is up, the CPU of that process tree while `--actors` bare actors
  start and answer one call each. `runtime env` passes `{"env_vars": {"OMP_NUM_THREADS": "1"}}` to
  `ray.init`, as `aa_ray.runtime.cluster.connect` did for every run; `none` passes nothing, as it
  does now without `env.py_modules` (Ray sets OMP_NUM_THREADS from an actor's CPUs itself). Any
  runtime env starts every worker through Ray's setup_worker.py and its runtime-env agent.
- **imports**: the user+system CPU of a fresh `python -c "import ray, <module>"` for the module each
  actor's class lives in (what Ray's worker imports to make the actor), against `import ray` alone.

CPU seconds, not wall time: on a busy machine the wall time of a start says little. The figures are
this machine's; the ratio of the two worker contenders is the result.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import alternate, base_parser, command_line, machine_info, print_machine, print_table, write_json

ACTOR_MODULES = {
    "replay buffer": "aa_ray.runtime.replay",
    "env runner": "aa_ray.runtime.env_runner",
    "learner": "aa_ray.runtime.learner",
    "fleet": "aa_ray.runtime.fleet",
}

# Run in a child: starts Ray, then prints the CPU its process tree spent starting the actors.
# Arguments: the runtime env (JSON), the actors to start, the seconds to let Ray's daemons settle first.
WORKERS = """
import json, sys, time
import psutil, ray
runtime_env = json.loads(sys.argv[1]) or None
ray.init(address="local", num_cpus=int(sys.argv[2]) + 1, include_dashboard=False, runtime_env=runtime_env,
         _system_config={"prestart_worker_first_driver": False})

@ray.remote(num_cpus=1)
class Bare:
    def ping(self):
        return 1

def tree_cpu(seen):
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            times = process.cpu_times()
            seen[process.pid] = times.user + times.system
        except psutil.Error:
            pass
    return sum(seen.values())

seen = {}
time.sleep(float(sys.argv[3]))  # Ray's daemons settle
before = tree_cpu(seen)
actors = [Bare.remote() for _ in range(int(sys.argv[2]))]
ray.get([actor.ping.remote() for actor in actors])
print(tree_cpu(seen) - before)
ray.shutdown()
"""


def workers_cpu(runtime_env: dict[str, Any] | None, actors: int, settle_s: float = 1.0) -> float:
    """CPU seconds the tree spent starting `actors` bare actors, as a rate (starts per CPU second)."""
    done = subprocess.run([sys.executable, "-c", WORKERS, json.dumps(runtime_env), str(actors), str(settle_s)],
                          capture_output=True, text=True, timeout=300, check=True)
    return actors / float(done.stdout.strip().splitlines()[-1])


def import_cpu(module: str) -> float:
    """User + system CPU seconds of a fresh interpreter importing ray and `module`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", f"import ray{', ' + module if module else ''}"], check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=5)
    parser.add_argument("--actors", type=int, default=4, help="bare actors started per repetition")
    args = parser.parse_args()
    modules = dict(ACTOR_MODULES)
    settle_s = 1.0
    if args.smoke:  # one start of each contender, not waiting for Ray to settle, and the one import without torch
        args.reps, args.actors, modules = 1, 1, {"replay buffer": ACTOR_MODULES["replay buffer"]}
        settle_s = 0.0
    info = machine_info()
    print_machine(info)
    print(f"# command: {command_line()}")

    print("## workers: actor starts per CPU second of the Ray process tree")
    starts = alternate([("runtime env", lambda: workers_cpu({"env_vars": {"OMP_NUM_THREADS": "1"}}, args.actors,
                                                            settle_s)),
                        ("none", lambda: workers_cpu(None, args.actors, settle_s))], args.reps)
    per_actor = {name: [1.0 / rate for rate in rates] for name, rates in starts.items()}
    print_table(["runtime env", "CPU s per actor start (median)", "reps"],
                [[name, statistics.median(values), len(values)] for name, values in per_actor.items()])
    saved = statistics.median(a - b for a, b in zip(per_actor["runtime env"], per_actor["none"], strict=True))
    print(f"CPU per actor start, runtime env / none: "
          f"{statistics.median(per_actor['runtime env']) / statistics.median(per_actor['none']):.2f} "
          f"(median saving {saved:.2f} s per actor)")

    print("## imports: CPU seconds of a fresh `import ray, <module>`")
    imports: dict[str, list[float]] = {"ray alone": [], **{name: [] for name in modules}}
    for _ in range(args.reps):
        for name in imports:
            imports[name].append(import_cpu(modules.get(name, "")))
        time.sleep(0.1)
    print_table(["actor", "module", "CPU s (median)"],
                [[name, modules.get(name, "ray"), statistics.median(values)] for name, values in imports.items()])
    write_json(args.json, {"machine": info, "command": command_line(), "args": vars(args),
                           "cpu_s_per_actor_start": per_actor, "import_cpu_s": imports})


if __name__ == "__main__":
    main()
