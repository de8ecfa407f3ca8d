"""What makes specs/mujoco/fast_cpu.yaml fast on a CPU: learner updates/s on HalfCheetah-v5's shapes
(17 observations, 6 actions) for each of its choices, against SB3's SAC update and aa-ray's `sac` at the
SB3 zoo's settings, all in one process, alternating; and what the compile costs, cold and from
Inductor's cache.

Run:
    .venv/bin/python benchmarks/bench_fast_cpu.py --part updates   # ~4 minutes on 2 cores, quiet machine
    .venv/bin/python benchmarks/bench_fast_cpu.py --part compile   # ~1.5 minutes
    .venv/bin/python benchmarks/bench_fast_cpu.py --part precision # ~8 minutes

`--part precision` (issue 34): the fast spec's learner with `algo.precision` bf16, fp32 and auto, and
SB3's SAC beside them, once on this CPU as it is and once in a process restricted to AVX2 the way a
CPU without bf16 instructions is (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, read when torch
starts, hence one child process per setting). Each child also times a bf16 and an fp32 matmul at the
spec's width, to show the restriction really makes bf16 slow, and says what `auto` resolved to.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    NO_SB3,
    SPECS,
    alternate,
    base_parser,
    median_ratio,
    print_table,
    random_transitions,
    run_part,
    sb3_installed,
)

from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah-v5
FAST = "mujoco/fast_cpu.yaml"
EAGER_FP32 = ["learners.compile=off", "algo.precision=fp32"]
# name -> (spec file, overrides, torch threads); each row changes one thing from the row it names
CONTENDERS: dict[str, tuple[str, list[str], int]] = {
    "sac (SB3 zoo settings)": ("mujoco/sac.yaml", [], 1),
    "crossq 256, eager fp32": (FAST, EAGER_FP32, 1),
    "crossq 256, compiled fp32": (FAST, ["algo.precision=fp32"], 1),
    "crossq 256, eager bf16": (FAST, ["learners.compile=off"], 1),
    "fast_cpu (compiled bf16)": (FAST, [], 1),
    "fast_cpu, batch 128": (FAST, ["algo.batch_size=128"], 1),
    "fast_cpu, 2 threads": (FAST, [], 2),
}


def learner_rate(spec_file: str, overrides: list[str], threads: int, updates: int) -> Callable[[], float]:
    spec = load_spec(SPECS / spec_file, [*overrides, "algo.utd_ratio=1"])
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    replay = ReplayBuffer(50_000, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(20_000, OBS_DIM, ACT_DIM))
    batch = spec.algo.batch_size
    torch.set_num_threads(threads)
    learner.update([], replay.sample(8, batch))  # compiles, where the spec asks for it: not timed

    def run() -> float:
        torch.set_num_threads(threads)
        samples = replay.sample(updates, batch)
        start = time.perf_counter()
        learner.update([], samples)
        return updates / (time.perf_counter() - start)

    return run


def sb3_rate(updates: int) -> Callable[[], float]:
    """Stable-Baselines3's SAC at the zoo's settings: `model.train` on a filled replay buffer."""
    import gymnasium as gym
    from stable_baselines3 import SAC

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), batch_size=256, learning_starts=0, device="cpu",
                policy_kwargs={"net_arch": [256, 256]}, seed=0)
    model.learn(300)  # fills a little of the replay buffer and sets up the logger `train` writes to
    data = random_transitions(20_000, OBS_DIM, ACT_DIM)
    for i in range(len(data.obs)):
        model.replay_buffer.add(data.obs[i:i + 1], data.next_obs[i:i + 1], data.action[i:i + 1],
                                data.reward[i:i + 1], data.terminated[i:i + 1], [{}])

    def run() -> float:
        torch.set_num_threads(1)
        start = time.perf_counter()
        model.train(gradient_steps=updates, batch_size=256)
        return updates / (time.perf_counter() - start)

    return run


def part_updates(args) -> dict:
    # the smoke cell leaves out the compiled rows: compiling the update takes minutes on a busy 2-core CPU
    chosen = {name: setting for name, setting in CONTENDERS.items()
              if not args.smoke or name == "sac (SB3 zoo settings)" or "eager" in name}
    contenders = [(name, learner_rate(*setting, args.updates)) for name, setting in chosen.items()]
    reference = "SB3 SAC" if sb3_installed() else "sac (SB3 zoo settings)"
    if sb3_installed():
        contenders.insert(0, ("SB3 SAC", sb3_rate(args.updates)))
    else:
        print(f"{NO_SB3}; the ratios are against aa-ray's sac at SB3's settings")
    rates = alternate(contenders, args.reps)
    rows = [[name, statistics.median(r), median_ratio(rates, name, reference)] for name, r in rates.items()]
    print_table(["learner", "updates/s (median)", f"ratio vs {reference}"], rows)
    return {"updates_per_s": {row[0]: row[1] for row in rows}, "ratio_vs": reference,
            f"ratio_vs_{'sb3' if reference == 'SB3 SAC' else 'sac'}": {row[0]: row[2] for row in rows}}


COMPILE_ONCE = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from bench_fast_cpu import learner_rate, FAST
start = time.perf_counter()
learner_rate(FAST, [], 1, 1)
print(time.perf_counter() - start)
"""


def part_compile(args) -> dict:
    """The fast spec's learner built and its first update run, in a fresh process, three times over
    one empty Inductor cache folder: the first pays the cold compile, the others read the cache."""
    seconds = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for attempt in ("cold", "cached", "cached"):
            out = subprocess.run([sys.executable, "-c", COMPILE_ONCE], env=env, capture_output=True, text=True,
                                 check=True)
            seconds.append(float(out.stdout.split()[-1]))
            print(f"  {attempt}: {seconds[-1]:.1f} s to the first update", flush=True)
    eager = subprocess.run([sys.executable, "-c", COMPILE_ONCE.replace("learner_rate(FAST, [],",
                                                                     "learner_rate(FAST, ['learners.compile=off'],")],
                           capture_output=True, text=True, check=True)
    rows = [["cold cache", seconds[0]], ["cached", statistics.median(seconds[1:])],
            ["eager (no compile)", float(eager.stdout.split()[-1])]]
    print_table(["fast_cpu learner", "seconds to its first update"], rows)
    return {"seconds_to_first_update": {row[0]: row[1] for row in rows}}


# the CPU settings `--part precision` runs in, each in its own process: what torch and oneDNN may use
CPU_SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2 (no bf16 instructions)": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "aten avx2 only": {"ATEN_CPU_CAPABILITY": "avx2"},
}
def precision_child(args) -> dict:
    """In this process's CPU setting: the matmul probe, what auto resolves to, and the fast spec's
    learner in each precision (compiled, as the spec runs it) beside SB3's SAC, alternating."""
    from aa_ray.algos.precision import bf16_matmul_speedup, resolve_precision

    torch.set_num_threads(1)
    speedups = [bf16_matmul_speedup(256, 512, 10) for _ in range(3)]
    contenders = [(p, learner_rate(FAST, [f"algo.precision={p}"], 1, args.updates)) for p in args.precisions.split(",")]
    if args.sb3:
        contenders.insert(0, ("SB3 SAC", sb3_rate(args.updates)))
    rates = alternate(contenders, args.reps)
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "bf16_matmul_speedup": statistics.median(speedups),
        "auto_resolves_to": resolve_precision("auto", torch.device("cpu")),
        "updates_per_s": {name: statistics.median(r) for name, r in rates.items()},
        "ratio_vs_fp32": {name: median_ratio(rates, name, "fp32") for name in rates},
        "ratio_vs_sb3": {name: median_ratio(rates, name, "SB3 SAC") for name in rates} if args.sb3 else {},
    }


def inductor_cache(setting: str) -> dict[str, str]:
    """A restricted setting's own Inductor cache folder: a process under ATEN_CPU_CAPABILITY=avx2 that
    read the cache an unrestricted one had filled failed to compile the update (torch 2.13:
    "SystemError: <built-in function kernel> returned a result with an exception set"; the learner
    then trained eagerly), and with a folder of its own it compiled."""
    if not CPU_SETTINGS[setting]:
        return {}
    slug = "".join(c if c.isalnum() else "_" for c in setting)
    return {"TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / f"torchinductor_{os.getuid()}_{slug}")}


def part_precision(args) -> dict:
    settings = [name for name in CPU_SETTINGS if name in args.settings.split(",") or args.settings == "all"]
    results = {}
    for setting in settings:
        print(f"## {setting}: {CPU_SETTINGS[setting] or 'no restriction'}", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [sys.executable, __file__, "--part", "precision-child", "--reps", str(args.reps),
                       "--updates", str(args.updates), "--precisions", args.precisions, "--json", out.name,
                       *(["--sb3"] if args.sb3 else [])]
            subprocess.run(command, env={**os.environ, **CPU_SETTINGS[setting], **inductor_cache(setting)}, check=True)
            results[setting] = json.loads(Path(out.name).read_text())
    rows = [
        [setting, name, r["updates_per_s"][name], r["ratio_vs_fp32"][name], r["ratio_vs_sb3"].get(name, float("nan")),
         r["auto_resolves_to"] if name == "auto" else "", r["bf16_matmul_speedup"]]
        for setting, r in results.items() for name in r["updates_per_s"]
    ]
    print_table(["cpu setting", "learner", "updates/s (median)", "ratio vs fp32", "ratio vs SB3", "auto ->",
                 "bf16 matmul speed-up"], rows)
    return results


def main() -> None:
    parser = base_parser(__doc__, reps=5)
    parser.add_argument("--part", choices=["updates", "compile", "precision", "precision-child"], default="updates")
    parser.add_argument("--updates", type=int, default=60, help="updates per timed repetition")
    parser.add_argument("--settings", default="native,avx2 (no bf16 instructions)",
                        help=f"--part precision: comma-separated names of {list(CPU_SETTINGS)}, or all")
    parser.add_argument("--sb3", action="store_true", help="--part precision: SB3's SAC update beside them")
    parser.add_argument("--precisions", default="bf16,fp32,auto",
                        help="--part precision: the fast spec's learners, built and first timed in this order")
    args = parser.parse_args()
    if args.smoke:  # the eager learners, one call of two updates each
        args.part, args.updates, args.reps = "updates", 2, 1
    if args.part == "precision-child":  # a child of --part precision: results to --json, no machine header
        payload = precision_child(args)
        Path(args.json).write_text(json.dumps(payload))
        return
    run_part(args, {"updates": part_updates, "compile": part_compile, "precision": part_precision})


if __name__ == "__main__":
    main()
