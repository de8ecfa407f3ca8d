"""GPU check: what one CUDA device does for aa-ray's off-policy learners and for a training run,
in one command that finishes within 8 minutes and writes its results as it goes.

    python benchmarks/gpu_check.py --install-wheels gpu_wheels --out $OUT/gpu_check.json

Parts (`--part timings|train|batched|all`, each runnable alone):

(a) timings: learner updates/s of `sac` (256x256 MLPs, `specs/sac.yaml`) and `sac_simba` at the
    SimbaV2 paper's sizes (critic 512 x 2 blocks, actor 128 x 1) for every batch size x
    `learners.compile` off/on x `algo.precision` fp32/bf16, on random transitions. The FLOPs of one
    update are counted once per (algo, batch) with `torch.utils.flop_counter.FlopCounterMode`, so
    each row also gives achieved TFLOP/s and its share of the device's own matmul peak, measured in
    this process (the best of square fp32 matmuls with TF32 off and bf16 ones). Each configuration
    gets a warm-up (compiling included, capped) and a fixed timed slice; eager rows run first, then
    compiled ones in priority order until the part's deadline, each in a child process of its own
    (a compile that crashes, hangs or is cut short by its cap costs its row only: torch's state
    after an interrupted compile is undefined, so that process is not used again). Host-to-device
    copies are timed, as in training (the learner is handed numpy batches).
(b) train: a slice of `specs/sac_simba.yaml` at paper sizes on HalfCheetah-v5 with
    `runtime.backend=inline` (runners, replay and learner in this process, no Ray),
    `tracking.enabled=false` and the learner on the GPU, stopped at a wall-clock deadline (and by a
    `budget.env_steps` sized from a quick rate estimate, should the deadline not be seen): env
    steps/s, critic updates/s and the last eval return.

(c) batched: the device path (`runtime.mode: device`) at the FastTD3 recipe's settings: 4096
    PointReach copies on the GPU (`envs/point_reach.py`), `fast_td3` at its paper's widths, batch
    8192: env steps/s of the simulator alone, of collection (acting and the replay ring, no
    learning) and of whole iterations, and the learner's busy share of them.

`--dry-run` runs the same code on the CPU at tiny sizes (a test runs it); `--install-wheels DIR`
first installs the wheels `scripts/fetch_gpu_wheels.sh` downloaded (offline) into this interpreter.
Where torch sees no CUDA device and `--dry-run` is not given, the check skips with exit status 0.
Results: JSON at `--out` (default `$OUT/gpu_check.json` when OUT is set, else
`benchmarks/gpu_check.json`), rewritten after every row, plus a markdown table next to it (`.md`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import signal
import site
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
SPECS = REPO / "specs"
OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah-v5's sizes: a realistic network input for the timings
REPLAY_ROWS = 200_000  # random transitions the timed learners sample from

# The SimbaV2 paper's network sizes (MuJoCo): what `sac_simba` is timed and trained at on the GPU
SIMBA_PAPER = ["algo.critic_hidden_dim=512", "algo.critic_num_blocks=2",
               "algo.actor_hidden_dim=128", "algo.actor_num_blocks=1"]
TINY_NETS = {  # --dry-run: the same code path, networks small enough for a few CPU seconds
    "sac": ["algo.actor_hidden_dims=[16, 16]", "algo.critic_hidden_dims=[16, 16]"],
    "sac_simba": ["algo.critic_hidden_dim=16", "algo.critic_num_blocks=1",
                  "algo.actor_hidden_dim=16", "algo.actor_num_blocks=1"],
}
SPEC_FILES = {"sac": SPECS / "sac.yaml", "sac_simba": SPECS / "sac_simba.yaml"}


# ---- time keeping ---------------------------------------------------------------------------------
class Clock:
    """Seconds since the check started, and progress lines stamped with them."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def at(self, seconds: float) -> float:
        """The monotonic time `seconds` after the start (a deadline)."""
        return self.start + seconds

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {message}", flush=True)


class StepTimeout(BaseException):
    """A warm-up (compiling, mostly) ran past its cap. A BaseException, like KeyboardInterrupt, so
    that no `except Exception` on the way (a compile fallback to eager, say) swallows it."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise StepTimeout in this (the main) thread after `seconds`. torch.compile runs in Python
    and in worker processes it waits on, so the alarm interrupts it at the next bytecode."""
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise StepTimeout(f"took more than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- installing the offline wheels --------------------------------------------------------------------
def wheel_requirements(folder: Path) -> list[str]:
    """`name==version` of every wheel in `folder` (from the file names, as the wheel spec puts them)."""
    requirements = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        requirements.append(f"{name}=={version}")
    return requirements


def install_wheels(folder: Path) -> None:
    """pip-install the wheels in `folder` into this interpreter, offline. --no-deps because the
    folder is a chosen closure (mujoco-studio, pillow, numpy and torch are left out on purpose)."""
    requirements = wheel_requirements(folder)
    if not requirements:
        raise SystemExit(f"gpu_check: no wheels in {folder}; run scripts/fetch_gpu_wheels.sh first")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--no-index", "--no-deps", "--find-links", str(folder), *requirements]
    print("gpu_check: installing:", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and "No module named pip" in done.stderr:  # a bare interpreter: pip ships inside it
        subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], capture_output=True)
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and "externally-managed-environment" in done.stderr:
        # a distribution's system Python (PEP 668): the GPU box is a throwaway machine
        print("gpu_check: the interpreter is externally managed; retrying with --break-system-packages")
        command.append("--break-system-packages")
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and "Permission denied" in done.stderr:  # site-packages not writable: the user's
        print("gpu_check: site-packages is not writable; retrying with --user")
        done = subprocess.run([*command, "--user"], capture_output=True, text=True)
        site.addsitedir(site.getusersitepackages())  # absent at start-up, so not on sys.path yet
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: installing the wheels failed:\n{done.stdout}{done.stderr}")
    importlib.invalidate_caches()  # the packages installed just now become importable


def short_error(err: BaseException) -> str:
    """An exception as one line for a table cell (the traceback is printed in full)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first[:240]}"


# ---- results -------------------------------------------------------------------------------------------
class Results:
    """The check's JSON payload, written whole after every row so a run killed at its time limit
    still leaves everything measured up to then."""

    def __init__(self, path: Path, payload: dict[str, Any]):
        self.path, self.payload = path, payload

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.payload, indent=2, default=str))
        self.path.with_suffix(".md").write_text(markdown(self.payload))


NUMBER_COLUMNS = (("updates_per_s", ",.1f"), ("transitions_per_s", ",.0f"), ("gflop_per_update", ".3f"),
                  ("tflops", ".3g"), ("percent_of_peak", ".1f"), ("warm_up_s", ".1f"), ("max_memory_gib", ".2f"))


def _cell(row: dict[str, Any], key: str, spec: str) -> str:
    value = row.get(key)
    return "" if value is None else format(value, spec)


def markdown(payload: dict[str, Any]) -> str:
    lines = [f"# GPU check ({payload.get('mode', '')})", ""]
    device = payload.get("device", {})
    lines.append(f"device: {device.get('name', '?')}; torch {payload.get('machine', {}).get('torch', '?')}; "
                 f"elapsed {payload.get('elapsed_s', 0):.0f} s; status: {payload.get('status', '?')}")
    peak = payload.get("matmul_peak_tflops")
    if peak:
        lines += ["", "matmul peak (TFLOP/s): " + ", ".join(f"{k} {v:.3g}" for k, v in peak.items())]
    rows = payload.get("timings")
    if rows:
        lines += ["", "| algo | batch | compile | precision | updates/s | transitions/s | GFLOP/update | TFLOP/s "
                  "| % of peak | warm-up s | GPU mem GiB | status |", "|" + "---|" * 12]
        for r in rows:
            cells = [r["algo"], r["batch"], r["compile"], r["precision"]]
            note = f" ({r['compile_note']})" if r.get("compile_note") else ""
            cells += [_cell(r, key, spec) for key, spec in NUMBER_COLUMNS] + [r["status"] + note]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for part, title in (("train", "training slice"), ("batched", "batched device path")):
        if payload.get(part):
            lines += ["", f"{title}: " + ", ".join(f"{k} {v}" for k, v in payload[part].items() if k != "overrides")]
    return "\n".join(lines) + "\n"


# ---- (a) learner timings ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    algo: str
    batch: int
    compile: str  # learners.compile
    precision: str  # algo.precision


def ordered_configs(algos: Sequence[str], batches: Sequence[int], compiles: Sequence[str],
                    precisions: Sequence[str]) -> list[Config]:
    """Eager rows first (cheap, they give the whole table), then compiled ones, whose compile takes
    tens of seconds each, in the order to keep when the deadline cuts the list: the smallest and
    the largest batch first (the launch-bound and the compute-bound regime), fp32 before bf16."""
    by_extremes = sorted(batches, key=lambda b: (b not in (min(batches), max(batches)), b))
    configs = []
    for mode in compiles:
        for batch in by_extremes:
            for precision in precisions:
                configs += [Config(algo, batch, mode, precision) for algo in algos]
    return sorted(configs, key=lambda c: c.compile != "off")  # stable: keeps the order within each group


def timing_spec(config: Config, dry_run: bool, matmul_precision: str) -> Any:
    from aa_ray.spec.loader import load_spec

    sizes = TINY_NETS[config.algo] if dry_run else (SIMBA_PAPER if config.algo == "sac_simba" else [])
    overrides = [
        "env.id=HalfCheetah-v5",
        f"learners.gpus_per_learner={0 if dry_run else 1}",
        f"learners.compile={config.compile}",
        f"learners.matmul_precision={matmul_precision}",
        f"algo.batch_size={config.batch}",
        f"algo.precision={config.precision}",
        "algo.utd_ratio=1",  # one batch per update call of the algorithm: the row's unit
        f"algo.buffer_size={REPLAY_ROWS}",
        *sizes,
    ]
    return load_spec(SPEC_FILES[config.algo], overrides)


def matmul_peak(device: Any, sizes: Sequence[int], seconds: float,
                labels: Sequence[str] = ("fp32", "bf16")) -> dict[str, float]:
    """TFLOP/s of square matmuls in fp32 (TF32 off: the true fp32 rate) and bf16, each size timed
    for about `seconds`. The float32 matmul setting is put back afterwards."""
    import torch

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # also turns TF32 off for CUDA matmuls
    peak: dict[str, float] = {}
    try:
        for label in labels:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[label]
            for n in sizes:
                a = torch.randn(n, n, device=device, dtype=dtype)
                b = torch.randn(n, n, device=device, dtype=dtype)
                for _ in range(2):  # warm-up: cuBLAS heuristics, clocks
                    a @ b
                synchronize(device)
                reps, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds or reps < 8:
                    for _ in range(4):
                        a @ b
                    reps += 4
                    synchronize(device)
                peak[f"{label}_{n}"] = 2 * n**3 * reps / (time.perf_counter() - start) / 1e12
                del a, b
    finally:
        torch.set_float32_matmul_precision(saved)
    return peak


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flops_per_update(spec: Any, samples: dict[str, Any]) -> float:
    """FLOPs (matmuls and the like, as FlopCounterMode counts them) of one update, counted on an
    eager learner built for the purpose: the math is the same whatever compile and precision do."""
    from torch.utils.flop_counter import FlopCounterMode

    from aa_ray.runtime.learner import Learner

    eager = spec.model_copy(update={"learners": spec.learners.model_copy(update={"compile": "off"})})
    learner = Learner(eager, OBS_DIM, ACT_DIM)
    with FlopCounterMode(display=False) as counter:
        learner.update([], samples)  # one batch: (1, batch, ...)
    return float(counter.get_total_flops())


def time_config(config: Config, args: argparse.Namespace, replay: Any, device: Any,
                compile_cap_s: float) -> dict[str, Any]:
    """One row: build a learner for the config, warm it up (compile included, capped), then run
    updates for the timed slice. FLOPs are the caller's (`add_flops`)."""
    import torch

    from aa_ray.runtime.learner import Learner

    row: dict[str, Any] = asdict(config)
    spec = timing_spec(config, args.dry_run, args.matmul_precision)
    sets = [replay.sample(args.chunk, config.batch) for _ in range(3)]  # sampled outside the timing
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    learner = Learner(spec, OBS_DIM, ACT_DIM)
    graphs_before = dynamo_graphs()
    start = time.perf_counter()
    try:
        with time_limit(compile_cap_s if config.compile != "off" else 0):
            for samples in sets[:2]:  # the first call compiles (when on); the second settles allocators
                learner.update([], samples)
            synchronize(device)
    except StepTimeout as err:
        row["status"] = f"compile timed out ({err})" if config.compile != "off" else f"warm-up timed out ({err})"
        return row
    row["warm_up_s"] = time.perf_counter() - start
    row["compiled_graphs"] = dynamo_graphs() - graphs_before
    if config.compile != "off" and not getattr(learner, "compiled", True):
        # the learner trains eagerly where compiling fails, after one logged warning (printed above)
        row["compile_note"] = "compiling failed, the learner fell back to eager: this row ran eagerly"
    elif config.compile != "off" and row["compiled_graphs"] == 0:
        row["compile_note"] = "no graph was compiled: this row ran eagerly"
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.timed_s or updates == 0:
        learner.update([], sets[updates // args.chunk % len(sets)])  # reads diagnostics: syncs the device
        updates += args.chunk
    synchronize(device)
    elapsed = time.perf_counter() - start
    rate = updates / elapsed
    row |= {"updates": updates, "timed_s": elapsed, "updates_per_s": rate,
            "transitions_per_s": rate * config.batch, "status": "ok"}
    if device.type == "cuda":
        row["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return row


def add_flops(row: dict[str, Any], flops: float, peak: dict[str, float]) -> None:
    """Achieved TFLOP/s, against the best matmul peak of any precision (the device's ceiling) and
    against the best one of the row's own precision (how far that precision is from its own)."""
    row["gflop_per_update"] = flops / 1e9
    if row.get("status") == "ok":
        row["tflops"] = flops * row["updates_per_s"] / 1e12
        row["percent_of_peak"] = 100 * row["tflops"] / max(peak.values())
        own = [value for name, value in peak.items() if name.startswith(row["precision"])]
        if own:
            row["percent_of_precision_peak"] = 100 * row["tflops"] / max(own)


CHILD_ROW = "GPU_CHECK_ROW "  # the line a child process reports its row on


def time_config_in_child(config: Config, args: argparse.Namespace, compile_cap_s: float) -> dict[str, Any]:
    """A compiled config in a process of its own: a compile that hangs in native code, crashes the
    interpreter or leaves CUDA in a bad state (a graph capture cut short) costs this row only. The
    child gets a soft cap on its compile and a hard timeout on top (its own start-up included)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child-config", json.dumps(asdict(config)),
               "--timed-s", str(args.timed_s), "--chunk", str(args.chunk), "--compile-cap-s", str(compile_cap_s),
               "--matmul-precision", args.matmul_precision, *(["--dry-run"] if args.dry_run else [])]
    hard_timeout = compile_cap_s + args.timed_s + CHILD_START_S
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=hard_timeout)
    except subprocess.TimeoutExpired:
        return asdict(config) | {"status": f"compile timed out (the child was killed after {hard_timeout:.0f} s)"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(CHILD_ROW):
            return json.loads(line[len(CHILD_ROW):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return asdict(config) | {"status": f"compile failed: the child exited with {done.returncode} ({tail[0][:240]})"}


CHILD_START_S = 45.0  # a child's own imports, CUDA context and replay fill, on top of its compile cap


def child_main(args: argparse.Namespace) -> int:
    """`--child-config`: time one config and print its row as the last line."""
    import torch

    config = Config(**json.loads(args.child_config))
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    try:
        row = time_config(config, args, filled_replay(args.dry_run), device, args.compile_cap_s)
    except Exception as err:
        traceback.print_exc()
        row = asdict(config) | {"status": f"compile failed: {short_error(err)}"}
    print(CHILD_ROW + json.dumps(row), flush=True)
    return 0


def filled_replay(dry_run: bool) -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    from _common import random_transitions

    from aa_ray.runtime.replay import ReplayBuffer

    rows = 20_000 if dry_run else REPLAY_ROWS
    replay = ReplayBuffer(rows, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(rows, OBS_DIM, ACT_DIM))
    return replay


def dynamo_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (its own counter): tells a row
    that really ran compiled code from one that fell back to eager."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


def release(device: Any) -> None:
    """Drop the last config's learner, so the next starts with the device memory free."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_timings(args: argparse.Namespace, clock: Clock, results: Results, deadline_s: float) -> None:
    import torch

    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    sizes = [256] if args.dry_run else [4096, 8192]
    clock.log(f"timings: matmul peak at sizes {sizes}")
    peak = matmul_peak(device, sizes, 0.2 if args.dry_run else 0.6)
    results.payload["matmul_peak_tflops"] = peak
    clock.log("timings: matmul peak " + ", ".join(f"{k} {v:.3g}" for k, v in peak.items()) + " TFLOP/s")
    replay = filled_replay(args.dry_run)
    flops: dict[tuple[str, int], float] = {}
    table: list[dict[str, Any]] = []
    results.payload["timings"] = table
    deadline = clock.at(deadline_s)
    for config in ordered_configs(args.algos, args.batches, args.compile, args.precisions):
        left = deadline - time.monotonic()
        compiled = config.compile != "off"
        # a compile needs tens of seconds on a GPU: start one only with room for it and its slice
        needed = args.timed_s + (args.min_compile_s if compiled else 2.0)
        if left < needed:
            table.append(asdict(config) | {"status": "skipped (deadline)"})
            clock.log(f"timings: {config} skipped, {left:.0f} s left")
            continue
        clock.log(f"timings: {config} ...")
        try:
            key = (config.algo, config.batch)
            if key not in flops:  # counted in this process, on an eager learner, once per (algo, batch)
                spec = timing_spec(config, args.dry_run, args.matmul_precision)
                flops[key] = flops_per_update(spec, replay.sample(1, config.batch))
            cap = max(1.0, min(args.compile_cap_s, left - args.timed_s))
            if compiled:
                row = time_config_in_child(config, args, cap)
            else:
                row = time_config(config, args, replay, device, cap)
            add_flops(row, flops[key], peak)
        except Exception as err:  # one broken config must not cost the rest of the table
            row = asdict(config) | {"status": f"failed: {short_error(err)}"}
            traceback.print_exc()
        table.append(row)
        release(device)
        results.payload["elapsed_s"] = clock.elapsed()
        results.write()
        summary = (f"{row['updates_per_s']:,.1f} updates/s, {row['tflops']:.3g} TFLOP/s, "
                   f"warm-up {row['warm_up_s']:.1f} s" if row.get("status") == "ok" else row["status"])
        clock.log(f"timings: {config.algo} batch {config.batch} compile {config.compile} {config.precision}: {summary}")


# ---- (b) a training slice -------------------------------------------------------------------------------------
def train_overrides(args: argparse.Namespace, run_dir: Path, env_steps: int) -> list[str]:
    common = [
        "runtime.backend=inline",  # runners, replay and learner in this process: no Ray on the box
        "tracking.enabled=false",  # no MLflow either
        f"runtime.output_dir={run_dir}",
        "checkpoint.every_env_steps=null",
        "checkpoint.save_replay=false",  # the final checkpoint stays small and quick
        "runners.num_runners=1",  # inline runners step one after another: one runner, many envs
        f"learners.compile={args.train_compile}",
        f"algo.precision={args.train_precision}",
        f"budget.env_steps={env_steps}",
    ]
    if args.dry_run:
        return [*common, "env.id=Pendulum-v1", "env.max_episode_steps=100", "learners.gpus_per_learner=0",
                "runners.envs_per_runner=2", "algo.batch_size=32", "algo.warm_up_steps=64", "algo.train_every=8",
                "algo.utd_ratio=1", "algo.buffer_size=10000", "eval.every_env_steps=1000000", "eval.episodes=1",
                *TINY_NETS["sac_simba"], *args.train_set]
    return [
        *common, "env.id=HalfCheetah-v5", "learners.gpus_per_learner=1",
        f"runners.envs_per_runner={args.envs_per_runner}",
        "algo.batch_size=256", "algo.buffer_size=1000000",
        "algo.warm_up_steps=5000",
        # 16 envs x train_every 8 = 128 transitions per iteration, utd 4 -> 32 critic updates: a
        # replay ratio of 1/4, enough updates to learn within the slice without starving the envs
        "algo.train_every=8", "algo.utd_ratio=4",
        # the paper's rates, not specs/sac_simba.yaml's (tuned for a short CPU run on pusher-reach)
        "algo.actor_lr=0.0001", "algo.critic_lr=0.0001", "algo.lr_end_fraction=0.5",
        "eval.every_env_steps=25000", "eval.episodes=5",
        *SIMBA_PAPER, *args.train_set,
    ]


def estimate_env_steps(args: argparse.Namespace, seconds: float, timings: list[dict[str, Any]]) -> int:
    """A budget for the slice: the env-only rate of one vector env with random actions, slowed by
    the updates each transition costs at the learner's timed rate (batch 256 eager, from part (a)
    when it ran, else a cautious guess), times the slice, with half again as margin. The wall-clock
    deadline is what stops the run; this only bounds it should the deadline not be seen."""
    import gymnasium as gym
    import numpy as np

    envs = gym.make_vec("HalfCheetah-v5", num_envs=args.envs_per_runner, vectorization_mode="sync")
    envs.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        envs.step(np.random.uniform(-1, 1, envs.action_space.shape).astype(np.float32))
        steps += args.envs_per_runner
    env_rate = steps / (time.perf_counter() - start)
    envs.close()
    timed = [r.get("updates_per_s") for r in timings
             if (r["algo"], r["batch"], r["compile"], r["precision"]) == ("sac_simba", 256, "off", "fp32")]
    update_rate = timed[0] if timed and timed[0] else 300.0
    updates_per_transition = 4 / args.envs_per_runner  # utd_ratio / envs, as train_overrides sets them
    rate = 1 / (1 / env_rate + updates_per_transition / update_rate)
    return int(rate * seconds * 1.5) + 5000  # + the warm-up, which runs at the env-only rate


class LearningPhase:
    """(time, env steps) at the first iteration past the warm-up and at the latest one: the
    learning phase's own rates, without start-up, the random-action warm-up and the final
    evaluation and checkpoint."""

    def __init__(self, warm_up_steps: int):
        self.warm_up_steps = warm_up_steps
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def stamp(self, env_steps: int) -> None:
        if env_steps >= self.warm_up_steps:
            self.last = (time.perf_counter(), env_steps)
            self.first = self.first or self.last

    def env_steps_per_s(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

    def seconds(self) -> float:
        return self.last[0] - self.first[0] if self.first and self.last else 0.0


def run_train(args: argparse.Namespace, clock: Clock, results: Results, deadline_s: float) -> None:
    from aa_ray import metric_names as m
    from aa_ray.spec.loader import load_spec

    summary: dict[str, Any] = {"status": "starting"}
    results.payload["train"] = summary
    slice_s = max(5.0, min(args.train_s, deadline_s - clock.elapsed() - 25.0))  # 25 s: set-up, last eval, close
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as run_dir:
        env_steps = 300 if args.dry_run else estimate_env_steps(args, slice_s, results.payload.get("timings", []))
        overrides = train_overrides(args, Path(run_dir), env_steps)
        summary["overrides"] = overrides
        spec = load_spec(SPEC_FILES["sac_simba"], overrides)
        try:
            from aa_ray.runtime.trainer import Trainer  # imports the runtime: fails where it still needs Ray
        except ImportError as err:
            summary["status"] = f"failed: the trainer does not import here ({err})"
            clock.log(f"train: {summary['status']}")
            return
        clock.log(f"train: {spec.env.id} sac_simba, {slice_s:.0f} s slice, budget {spec.budget.env_steps:,} env steps")
        trainer = Trainer(spec, run_dir=Path(run_dir) / "run", track=False, live=False)
        phase = LearningPhase(spec.algo.warm_up_steps)
        from _common import stop_when

        deadline = time.monotonic() + slice_s

        def slice_over(env_steps: int) -> bool:
            phase.stamp(env_steps)
            return time.monotonic() >= deadline

        summary["deadline_installed"] = stop_when(trainer, slice_over, "wall-clock slice")
        start = time.perf_counter()
        try:
            result = trainer.run()
        except Exception as err:
            traceback.print_exc()
            summary["status"] = f"failed: {short_error(err)}"
            clock.log(f"train: {summary['status']}")
            return
        wall = time.perf_counter() - start
    updates = trainer.last_metrics.get(m.LEARNER_GRADIENT_UPDATES, 0.0)  # sac_simba: one per critic step
    evals = result.evals
    summary |= {
        "status": "ok",
        "env": spec.env.id,
        "stop_reason": result.stop_reason,
        "env_steps": result.env_steps,
        "wall_s": round(wall, 1),
        "env_steps_per_s": round(result.env_steps / wall, 1),
        "critic_updates": int(updates),
        "critic_updates_per_s": round(updates / wall, 1),
        # past the warm-up, to the last iteration: what training itself sustains
        "learning_s": round(phase.seconds(), 1),
        "learning_env_steps_per_s": round(rate, 1) if (rate := phase.env_steps_per_s()) else None,
        "learning_critic_updates_per_s": round(updates / phase.seconds(), 1) if phase.seconds() else None,
        "last_eval_return": evals[-1].get(m.EVAL_RETURN) if evals else None,
        "last_eval_at_env_steps": evals[-1].get(m.EVAL_AT_ENV_STEPS) if evals else None,
    }
    clock.log("train: " + ", ".join(f"{k} {v}" for k, v in summary.items() if k != "overrides"))


# ---- (c) the batched device path ----------------------------------------------------------------------------
def batched_overrides(args: argparse.Namespace) -> list[str]:
    """`specs/sac_point_reach.yaml` as the FastTD3 recipe on the device path: `fast_td3` at its paper's
    network sizes, `--batched-envs` copies of PointReach on the GPU, batch `--batched-batch`."""
    dry = args.dry_run
    nets = (["algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]"] if dry else
            ["algo.actor_hidden_dims=[512, 256, 128]", "algo.critic_hidden_dims=[1024, 512, 256]"])
    return [
        "algo.name=fast_td3", *nets, f"algo.batch_size={args.batched_batch}", "algo.utd_ratio=2",
        "algo.train_every=1", "algo.warm_up_steps=0", "algo.n_step=3", "algo.gamma=0.97",
        f"runners.envs_per_runner={args.batched_envs}", "runtime.mode=device", "runtime.backend=inline",
        f"env.device={'cpu' if dry else 'cuda'}", f"learners.gpus_per_learner={0 if dry else 1}",
        "tracking.enabled=false", "budget.stop_at=null", "budget.env_steps=100000000",
    ]


def run_batched(args: argparse.Namespace, clock: Clock, results: Results, deadline_s: float) -> None:
    """Env steps/s of PointReach's copies on the device: the simulator alone, collection through the
    device learner (acting, the ring, no learning), and whole iterations at the FastTD3 recipe's
    settings, with the learner's busy share (its update seconds over the iteration's)."""
    import torch

    from aa_ray import metric_names as m
    from aa_ray.envs.make import env_dims
    from aa_ray.envs.point_reach import PointReach
    from aa_ray.runtime.device_learner import DeviceLearner
    from aa_ray.spec.loader import load_spec

    summary: dict[str, Any] = {"status": "starting", "envs": args.batched_envs, "batch": args.batched_batch}
    results.payload["batched"] = summary
    spec = load_spec(SPECS / "sac_point_reach.yaml", batched_overrides(args))
    summary["overrides"] = batched_overrides(args)
    device = torch.device(spec.env.device)
    slice_s = max(1.0, min(args.batched_s, (deadline_s - clock.elapsed()) / 4))

    def rate(step: Callable[[], int]) -> float:
        step()  # warm-up: allocations, the first kernels
        synchronize(device)
        start, done = time.perf_counter(), 0
        while time.perf_counter() - start < slice_s:
            done += step()
        synchronize(device)
        return done / (time.perf_counter() - start)

    env = PointReach(args.batched_envs, device=device)
    env.reset(seed=0)
    generator = torch.Generator(device).manual_seed(0)
    actions = lambda: torch.rand((args.batched_envs, 2), generator=generator, device=device) * 2 - 1  # noqa: E731
    summary["simulator_env_steps_per_s"] = round(rate(lambda: env.step(actions()) and args.batched_envs), 1)
    obs, act_dim = env_dims(spec)
    learner = DeviceLearner(spec, obs, act_dim)
    learner.iterate(1, random_actions=True, learn=False)  # the ring holds a step to learn from
    summary["collect_env_steps_per_s"] = round(
        rate(lambda: learner.iterate(1, random_actions=False, learn=False)[0].env_steps), 1)
    clock.log(f"batched: collection {summary['collect_env_steps_per_s']:,.0f} env steps/s, simulator alone "
              f"{summary['simulator_env_steps_per_s']:,.0f}")
    update_s: list[float] = []

    def learn_step() -> int:
        stats, report = learner.iterate(1, random_actions=False, learn=True)
        update_s.append(report.metrics[m.LEARNER_UPDATE_TIME_S])
        return stats.env_steps

    start = time.perf_counter()
    summary["learn_env_steps_per_s"] = round(rate(learn_step), 1)
    wall = time.perf_counter() - start
    summary["learner_busy_share"] = round(sum(update_s[1:]) / max(wall - (update_s[0] if update_s else 0), 1e-9), 3)
    summary["status"] = "ok"
    clock.log("batched: " + ", ".join(f"{k} {v}" for k, v in summary.items() if k != "overrides"))


# ---- the command ----------------------------------------------------------------------------------------------
def default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu_check.json" if out else BENCHMARKS / "gpu_check.json"


def csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(item) for item in text.split(",") if item]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["timings", "train", "batched", "all"], default="all")
    parser.add_argument("--out", type=Path, default=None, help="the JSON result (a .md is written next to it)")
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU at tiny sizes")
    parser.add_argument("--install-wheels", type=Path, default=None, metavar="DIR",
                        help="first pip-install the wheels in DIR (offline) into this interpreter")
    parser.add_argument("--total-s", type=float, default=None, help="the whole check's wall clock (default 470)")
    parser.add_argument("--algos", type=csv(str), default=["sac_simba", "sac"])
    parser.add_argument("--batches", type=csv(int), default=None, help="default 256,1024,8192 (dry run: 32)")
    parser.add_argument("--compile", type=csv(str), default=["off", "on"], help="learners.compile values")
    parser.add_argument("--precisions", type=csv(str), default=["fp32", "bf16"], help="algo.precision values")
    parser.add_argument("--matmul-precision", choices=["highest", "high"], default="highest",
                        help="learners.matmul_precision for every timing row")
    parser.add_argument("--timed-s", type=float, default=None, help="timed seconds per config (default 4)")
    parser.add_argument("--chunk", type=int, default=None, help="batches per learner.update call (default 8)")
    parser.add_argument("--compile-cap-s", type=float, default=None,
                        help="cap on one config's compile (default 75; dry run 4)")
    parser.add_argument("--min-compile-s", type=float, default=None,
                        help="start a compiled config only with this much time left for compiling (default 20)")
    parser.add_argument("--train-s", type=float, default=None, help="the training slice's seconds (default 165)")
    parser.add_argument("--envs-per-runner", type=int, default=16)
    parser.add_argument("--train-compile", choices=["off", "on", "auto"], default="off")
    parser.add_argument("--train-precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--batched-envs", type=int, default=None, help="PointReach copies (default 4096)")
    parser.add_argument("--batched-batch", type=int, default=None, help="the batched part's batch (default 8192)")
    parser.add_argument("--batched-s", type=float, default=None, help="seconds per batched cell (default 10)")
    parser.add_argument("--child-config", default=None, help=argparse.SUPPRESS)  # one compiled config (internal)
    parser.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra spec override for the training slice (repeatable)")
    args = parser.parse_args(argv)
    dry = args.dry_run
    defaults = {"total_s": 90.0 if dry else 470.0, "batches": [32] if dry else [256, 1024, 8192],
                "timed_s": 0.3 if dry else 4.0, "chunk": 2 if dry else 8,
                # a cold compile takes minutes on a small CPU: the dry run checks the path and the cap
                "compile_cap_s": 4.0 if dry else 75.0,
                "min_compile_s": 2.0 if dry else 20.0,
                "train_s": 20.0 if dry else 165.0,
                "batched_envs": 64 if dry else 4096, "batched_batch": 64 if dry else 8192,
                "batched_s": 1.0 if dry else 10.0}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.out = args.out or default_out()
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # the GPU box runs this from a bare checkout: aa_ray is imported from the tree, not installed
    sys.path.insert(0, str(REPO))
    if args.child_config is not None:
        return child_main(args)
    clock = Clock()
    if args.install_wheels is not None:
        install_wheels(args.install_wheels)
        clock.log(f"installed the wheels in {args.install_wheels}")
    import torch

    sys.path.insert(0, str(BENCHMARKS))
    from _common import machine_info

    payload: dict[str, Any] = {"mode": "dry run (CPU)" if args.dry_run else "CUDA", "status": "running",
                               "machine": machine_info(), "command": " ".join(sys.argv)}
    results = Results(args.out, payload)
    if not args.dry_run and not torch.cuda.is_available():
        payload["status"] = "skipped: torch sees no CUDA device on this machine"
        results.write()
        print(f"gpu_check: {payload['status']}")
        return 0
    payload["device"] = {"name": torch.cuda.get_device_name(0) if not args.dry_run else "cpu",
                         "count": torch.cuda.device_count() if not args.dry_run else 0,
                         "cpus": os.cpu_count()}
    clock.log(f"gpu_check on {payload['device']['name']}: part {args.part}, {args.total_s:.0f} s in all, "
              f"results to {args.out}")
    results.write()
    # the training slice keeps its time: the timings stop starting configs in time to leave it
    batched_reserve = 4 * args.batched_s + (5.0 if args.dry_run else 30.0) if args.part == "all" else 0.0
    train_reserve = args.train_s + (10.0 if args.dry_run else 30.0) if args.part == "all" else 0.0
    failures = []
    for part, run in (
        ("timings", lambda: run_timings(args, clock, results, args.total_s - train_reserve - batched_reserve)),
        ("train", lambda: run_train(args, clock, results, args.total_s - batched_reserve)),
        ("batched", lambda: run_batched(args, clock, results, args.total_s)),
    ):
        if args.part not in (part, "all"):
            continue
        try:
            run()
        except Exception as err:  # a part that breaks outside its rows must not cost the other part
            traceback.print_exc()
            failures.append(f"{part} failed: {short_error(err)}")
            clock.log(failures[-1])
    payload["failures"] = failures
    # a row cut short by the deadline or the compile cap is a result (the table says so), not a failure
    statuses = [row["status"] for row in payload.get("timings", [])]
    statuses += [payload.get(part, {}).get("status", "ok") for part in ("train", "batched")]
    broken = [s for s in [*statuses, *failures] if s.startswith(("failed", "compile failed", "timings", "train"))]
    payload["status"] = "ok" if not broken else "some parts failed"
    payload["elapsed_s"] = clock.elapsed()
    # the inline, untracked path is meant to run where neither is installed: check it did not load them
    payload["loaded"] = {name: name in sys.modules for name in ("ray", "mlflow")}
    results.write()
    print(markdown(payload))
    clock.log(f"done: {payload['status']}; wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
