"""Scale, simulated on one machine: aa-ray's real runtime (env-runner actors, the replay actor, the
learner actor, the object store, the driver loop) on a local multi-node Ray cluster
(`ray.cluster_utils.Cluster`: one raylet and object store per node, logical CPUs), around the
synthetic workload of `benchmarks/scale_sim` (an env whose step sleeps a set time, a learner plugin
whose update sleeps a set time). The run joins the cluster as a user's run does (`RAY_ADDRESS`).

Parts:
- ceiling:    zero-cost env and learner: env steps/s for 1-32 runners x 1-64 envs per runner, and
              the CPU seconds the whole cluster spends per transition (by process kind);
- efficiency: a 2 ms env step, 1-32 runners over 1-4 nodes: measured / ideal, ideal = runners / step;
- gpu:        the timed learner at LeanRL's H100 SAC figure (1.4 ms per update), batch 8192,
              UTD 1-8, 32 runners: the fraction of the learner's time spent updating (busy) and so
              waiting for data (1 - busy);
- replay:     the replay actor alone, across nodes: adds/s, samples/s and MB/s at batch 256 and 8192;
- runner:     one env runner in process: CPU per vector step and per env (the model's c_act, c_env);
- tiny:       2 nodes, 4 runners, a few seconds: what CI runs (tests/test_scale_harness.py).

Every cell is one run of `Trainer` stopped after `--seconds` of learning; what is reported is the
steady state between CPU samples taken at iteration ends (warm-up and the final evaluation left out).

Run from the repository root:
    .venv/bin/python benchmarks/bench_scale.py --part ceiling [--seconds 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import atexit
import functools
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from aa_ray import metric_names as m

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from _common import REPO, command_line, machine_info, print_machine, print_table, stop_when, write_json  # noqa: E402

SPEC = BENCHMARKS / "scale_sim.yaml"
LEANRL_H100_SAC_UPDATE_S = 1.4e-3  # scale_sim/timed_learner.py says where it comes from
SAMPLE_EVERY_S = 0.5  # CPU counters are read at an iteration's end at most this often


# ---- the cluster ------------------------------------------------------------------------------------------------
@contextmanager
def simulated_cluster(nodes: int, cpus_per_node: int, gpus_per_node: int = 0, lean: bool = False) -> Iterator[Any]:
    """A local Ray cluster of `nodes` nodes (a head and workers, each a raylet with its own object
    store, `cpus_per_node` logical CPUs) that runs started while inside join through RAY_ADDRESS.
    `lean` leaves out Ray's dashboard and the idle workers Ray starts for the first driver, which no
    run here uses: seconds of CPU that a smoke cell saves (measured cells keep Ray's defaults)."""
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": cpus_per_node, "num_gpus": gpus_per_node, "object_store_memory": 300 * 2**20}
    head_args = node_args | ({"include_dashboard": False, "_system_config": {"prestart_worker_first_driver": False}}
                             if lean else {})
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    for _ in range(nodes - 1):
        cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = cluster.address
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous
        cluster.shutdown()


def cpus_per_node(runners: int, nodes: int) -> int:
    """Logical CPUs per node for `runners` runners, a learner and the replay actor over `nodes` nodes."""
    return math.ceil((runners + 2) / nodes) + 1


# ---- one measured run -------------------------------------------------------------------------------------------
def process_kind(proc: psutil.Process) -> str:
    """What a process of the cluster is: an actor's class (Ray titles its workers `ray::Class...`),
    'driver', or 'ray' for Ray's own daemons (raylets, GCS, object managers, idle workers)."""
    if proc.pid == os.getpid():
        return "driver"
    try:
        title = proc.cmdline()[0] if proc.cmdline() else proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "ray"
    if title.startswith("ray::"):
        name = title[5:].split(".")[0].split(" ")[0]
        return name if name in ("EnvRunner", "ReplayBuffer", "Learner", "Fleet") else "ray"
    return "ray"


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of this process and every process under it (the whole
    simulated cluster: cluster_utils starts its daemons, which start the workers), with its kind."""
    seconds: dict[int, tuple[str, float]] = {}
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            if proc.cmdline()[-1:] == ["--speed-probe"]:
                continue  # the harness's SpeedProbe: the machine's other load, not the cluster's
            times = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        seconds[proc.pid] = (process_kind(proc), times.user + times.system)
    return seconds


def cpu_by_kind() -> dict[str, float]:
    """`cpu_by_process` summed by kind."""
    seconds: dict[str, float] = defaultdict(float)
    for kind, spent in cpu_by_process().values():
        seconds[kind] += spent
    return dict(seconds)


@dataclass
class Sample:
    wall: float
    env_steps: int
    iterations: int
    learner_busy_s: float  # learner update seconds so far (the learner's own clock)
    collecting_s: float  # seconds the slowest runner spent collecting, summed over iterations
    gradient_updates: float  # the learners' gradient updates so far
    cpu: dict[int, tuple[str, float]]  # pid -> (kind, CPU seconds so far)
    measuring_s: float  # the driver's CPU seconds so far spent reading these counters (not the run's)
    machine_busy_s: float  # CPU seconds the whole machine spent so far, every process on it


def machine_busy_s() -> float:
    """CPU seconds every process of the machine has spent since boot (all but idle and I/O wait)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@dataclass
class Cell:
    """One measured configuration, in its steady state."""

    config: dict[str, Any]
    env_steps_per_s: float = 0.0
    window_s: float = 0.0
    iterations: int = 0
    cpu_us_per_transition: dict[str, float] = field(default_factory=dict)
    driver_ms_per_iteration: float = 0.0  # wall
    driver_cpu_ms_per_iteration: float = 0.0  # the driver process's CPU
    learner_busy: float = 0.0  # fraction of the window the learner spent in its update call (host work included)
    device_busy: float = 0.0  # fraction of the window a GPU would compute: updates x update_s (timed learner)
    runners_busy: float = 0.0  # fraction of the window the runners spent collecting (stepping envs and acting)
    # each kind's busiest process: its CPU seconds / the window (1.0: a core's worth, the most one process can use)
    busiest_process: dict[str, float] = field(default_factory=dict)
    placement: dict[str, list[int]] = field(default_factory=dict)  # actor kind -> the node (index) of each
    # the machine during the window: cores' worth of CPU the cluster used, and that everything else on the
    # machine used (the cores the cell could not have); the 1, 5 and 15-minute load averages at its end
    cluster_cores: float = 0.0
    other_cores: float = 0.0
    load_average: tuple[float, ...] = ()
    vm_speed: dict[str, float] = field(default_factory=dict)  # SpeedProbe.during the window
    status: str = "ok"


class IterationLog:
    """Time stamps of a trainer's iterations (it wraps the run record's `show`, called once per
    iteration), with the cluster's CPU counters read at most every SAMPLE_EVERY_S."""

    def __init__(self, trainer: Any, learning_from: int):
        self.samples: list[Sample] = []
        self.learning_from = learning_from
        self.iterations = 0
        self.busy_s = 0.0
        self.updates = 0.0
        self.collecting_s = 0.0
        self.learning_since: float | None = None
        self.placement: dict[str, list[int]] = {}
        self.measuring_s = 0.0
        show = trainer.record.show

        def show_and_stamp(env_steps: int, metrics: dict[str, float]) -> None:
            show(env_steps, metrics)
            now = time.perf_counter()
            if self.iterations == 0:
                self.placement = actor_nodes(trainer.spec, trainer.graph)
            self.iterations += 1
            self.busy_s += metrics.get("time/learner_update_s", 0.0)
            self.collecting_s += metrics.get(f"time/{m.PHASE_COLLECT}_s", 0.0)
            self.updates = metrics.get(m.LEARNER_GRADIENT_UPDATES, self.updates)
            if env_steps < self.learning_from:
                return
            self.learning_since = self.learning_since or now
            if not self.samples or now - self.samples[-1].wall >= SAMPLE_EVERY_S:
                # reading ~40 processes' counters costs the driver's process milliseconds: kept apart
                before = time.process_time()
                cpu = cpu_by_process()
                self.measuring_s += time.process_time() - before
                self.samples.append(Sample(now, env_steps, self.iterations, self.busy_s, self.collecting_s,
                                           self.updates, cpu, self.measuring_s, machine_busy_s()))

        trainer.record.show = show_and_stamp

    def learned_for(self) -> float:
        return 0.0 if self.learning_since is None else time.perf_counter() - self.learning_since

    def steady(self, cell: Cell, settle_s: float, update_s: float, probe: SpeedProbe) -> Cell:
        """Fill `cell` from the samples between `settle_s` into learning and the last one before the
        final iteration (which evaluates)."""
        samples = [s for s in self.samples[:-1] if s.wall - self.samples[0].wall >= settle_s]
        if len(samples) < 2:
            cell.status = f"too short ({len(self.samples)} samples)"
            return cell
        cell.placement = self.placement
        first, last = samples[0], samples[-1]
        steps = last.env_steps - first.env_steps
        cell.window_s = last.wall - first.wall
        cell.env_steps_per_s = steps / cell.window_s
        cell.iterations = last.iterations - first.iterations
        cell.driver_ms_per_iteration = 1e3 * cell.window_s / max(cell.iterations, 1)
        cell.learner_busy = (last.learner_busy_s - first.learner_busy_s) / cell.window_s
        cell.device_busy = (last.gradient_updates - first.gradient_updates) * update_s / cell.window_s
        cell.runners_busy = (last.collecting_s - first.collecting_s) / cell.window_s
        used: dict[str, float] = defaultdict(float)
        # the harness's own reading of the counters is not the driver's work (it grows with the process count)
        measuring = last.measuring_s - first.measuring_s
        for pid, (kind, seconds) in last.cpu.items():
            spent = seconds - first.cpu.get(pid, (kind, 0.0))[1] - (measuring if kind == "driver" else 0.0)
            used[kind] += spent
            cell.busiest_process[kind] = max(cell.busiest_process.get(kind, 0.0), spent / cell.window_s)
        cell.cluster_cores = sum(used.values()) / cell.window_s
        cell.other_cores = max(0.0, (last.machine_busy_s - first.machine_busy_s) / cell.window_s - cell.cluster_cores)
        cell.load_average = tuple(round(load, 2) for load in os.getloadavg())
        cell.vm_speed = probe.during(first.wall, last.wall)
        cell.cpu_us_per_transition = {kind: 1e6 * s / steps for kind, s in sorted(used.items())} if steps else {}
        cell.cpu_us_per_transition["total"] = sum(cell.cpu_us_per_transition.values())
        cell.driver_cpu_ms_per_iteration = 1e3 * used.get("driver", 0.0) / max(cell.iterations, 1)
        return cell


def actor_nodes(spec: Any, graph: Any) -> dict[str, list[int]]:
    """Which node (an index in the order Ray lists the nodes) holds each actor of the run, read from
    its placement group's table in the order of `spec.bundles()` (learners, runners; replay shard 0 in
    learner 0's bundle, each other shard in its first runner's)."""
    import ray

    group = getattr(graph.actors, "group", None)
    if group is None:
        return {}
    nodes = [node["NodeID"] for node in ray.nodes()]
    table = ray.util.placement_group_table(group)["bundles_to_node_id"]
    where = [nodes.index(table[graph.actors.bundle_offset + i]) for i in range(len(spec.bundles()))]
    learners = spec.learners.num_learners
    replay = [where[0] if shard == 0 else where[learners + spec.first_runner_of_replay_shard(shard)]
              for shard in range(spec.runtime.replay_shards)] if spec.algo.replay_actor else []
    return {"learners": where[:learners], "replay": replay, "runners": where[learners:]}


def reference_cpu_us(tries: int = 2, iterations: int = 1000) -> float:
    """The CPU per iteration (least of `tries`, in this process) of a fixed piece of the work a runner's
    step does: small numpy ops and Python around them, about 5 us at the full speed of the 2-core AMD
    EPYC VMs of RESULTS 44. Those VMs ran everything, learner and runners alike, about twice as slowly
    for seconds to minutes at a time; `SpeedProbe` reads this through every cell."""
    import numpy as np

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)

    def work() -> None:
        for _ in range(iterations):
            y = x @ w
            np.maximum(y, 0.0, out=y)
            record = {"y": np.tanh(y[:, :8]), "sum": float(y.sum())}
            del record

    return 1e6 * min(timed_cpu(work) for _ in range(tries)) / iterations


PROBE_EVERY_S = 0.5


class SpeedProbe:
    """The VM's speed through the cells: a child process (`--speed-probe`) that every PROBE_EVERY_S
    reads `reference_cpu_us` (about 10 ms of CPU at full speed, 2% of a core) and prints it; each
    reading is kept with the time it arrived. Its process is not the cluster's: its CPU counts among
    the machine's other load."""

    def __init__(self) -> None:
        self.readings: list[tuple[float, float]] = []
        self.process = subprocess.Popen([sys.executable, __file__, "--speed-probe"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.process.kill)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.readings.append((time.perf_counter(), float(line)))

    def during(self, start: float, end: float) -> dict[str, float]:
        """The readings between `start` and `end` (perf_counter): how many, their median and the
        slowdown, that median over the fastest reading so far."""
        window = sorted(us for at, us in self.readings if start <= at <= end)
        if not window:
            return {}
        fastest = min(us for _, us in self.readings)
        median = window[len(window) // 2]
        return {"readings": len(window), "median_us": round(median, 2), "fastest_us": round(fastest, 2),
                "slowdown": round(median / fastest, 2)}


def run_speed_probe() -> None:
    """The probe's process: a reading every PROBE_EVERY_S until its parent goes."""
    os.nice(5)  # below the harness and the daemons, above Ray's workers (nice 15): readings keep coming
    reference_cpu_us()  # warm-up
    try:
        while True:
            print(f"{reference_cpu_us():.3f}", flush=True)
            time.sleep(PROBE_EVERY_S)
    except BrokenPipeError:  # the harness is gone (killed before it could end the probe)
        os._exit(0)


@functools.cache
def speed_probe() -> SpeedProbe:
    return SpeedProbe()


def measure(config: dict[str, Any], overrides: Sequence[str], seconds: float, settle_s: float = 1.0) -> Cell:
    """Run the synthetic spec with `overrides` on the cluster RAY_ADDRESS names, stop it after
    `seconds` of learning, and return its steady state."""
    from aa_ray.runtime.trainer import Trainer
    from aa_ray.spec.loader import load_spec

    probe = speed_probe()
    spec = load_spec(SPEC, [*overrides, "budget.env_steps=1000000000"])
    cell = Cell(config)
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as folder:
        trainer = Trainer(spec, run_dir=Path(folder) / "run", track=False, live=False)
        log = IterationLog(trainer, learning_from=spec.algo.warm_up_steps)
        stop_when(trainer, lambda env_steps: log.learned_for() >= seconds, "measured")
        try:
            trainer.run()
        except Exception as err:  # a cell that fails is a result (the table says so), not the end of the sweep
            cell.status = f"failed: {type(err).__name__}: {str(err)[:200]}"
            return cell
    return log.steady(cell, settle_s, spec.algo.update_s, probe)


def workload(runners: int, envs: int, step_s: float = 0.0, update_s: float = 0.0, batch: int = 256,
             utd: int = 1, train_every: int = 32, extra: Sequence[str] = ()) -> list[str]:
    warm_up = max(batch, 500)
    return [
        f"runners.num_runners={runners}", f"runners.envs_per_runner={envs}", f"env.kwargs.step_s={step_s}",
        f"algo.update_s={update_s}", f"algo.batch_size={batch}", f"algo.utd_ratio={utd}",
        f"algo.train_every={train_every}", f"algo.warm_up_steps={warm_up}", *extra,
    ]


class Results:
    """What the harness measured so far, written to `--json` after every cell: a long sweep that is
    stopped keeps what it measured."""

    def __init__(self, path: Path | None, header: dict[str, Any]):
        self.path, self.payload = path, dict(header)

    def add(self, part: str, cell: Cell, columns: Sequence[str]) -> Cell:
        self.payload.setdefault(part, []).append(asdict(cell))
        write_json(self.path, self.payload)
        show_cells([cell], columns)
        return cell

    def put(self, part: str, rows: list[dict[str, Any]]) -> None:
        self.payload[part] = rows
        write_json(self.path, self.payload)


def show_cells(cells: Sequence[Cell], columns: Sequence[str]) -> None:
    rows = []
    for cell in cells:
        cpu = cell.cpu_us_per_transition
        rows.append([*(cell.config[c] for c in columns), round(cell.env_steps_per_s), cell.config.get("ideal", ""),
                     f"{cell.env_steps_per_s / cell.config['ideal']:.0%}" if cell.config.get("ideal") else "",
                     round(cpu.get("total", 0.0), 1), round(cell.driver_ms_per_iteration, 1),
                     round(cell.driver_cpu_ms_per_iteration, 1),
                     f"{cell.runners_busy:.0%}", f"{cell.learner_busy:.0%}", f"{cell.device_busy:.0%}",
                     f"{cell.busiest_process.get('ReplayBuffer', 0.0):.0%}",
                     f"{cell.cluster_cores:.2f} / {cell.other_cores:.2f}",
                     cell.vm_speed.get("slowdown", ""), cell.status])
    print_table([*columns, "env steps/s", "ideal", "efficiency", "CPU us/transition", "ms/iteration",
                 "driver CPU ms/iteration",
                 "runners collecting", "learner in update", "GPU busy (simulated)", "busiest replay actor's CPU",
                 "cores: cluster / others", "VM slowdown", "status"], rows)


# ---- the parts ------------------------------------------------------------------------------------------------
def part_ceiling(args: argparse.Namespace, results: Results) -> None:
    cells = []
    runner_counts = args.runners or [1, 2, 4, 8, 16, 32]
    env_counts = args.envs or [1, 4, 16, 64]
    nodes = args.nodes or [2]
    with simulated_cluster(nodes[0], cpus_per_node(max(runner_counts), nodes[0])):
        for runners in runner_counts:
            for envs in env_counts:
                config = {"runners": runners, "envs": envs, "nodes": nodes[0]}
                overrides = workload(runners, envs, train_every=args.train_every, extra=args.set)
                cells.append(results.add("ceiling", measure(config, overrides, args.seconds), list(config)))
    print("\nthe runtime's ceiling (zero-cost env and learner):")
    show_cells(cells, ["runners", "envs", "nodes"])


def part_efficiency(args: argparse.Namespace, results: Results) -> None:
    cells = []
    step_s = args.step_s
    runner_counts = args.runners or [1, 2, 4, 8, 16, 32]
    for nodes in args.nodes or [1, 2, 4]:
        with simulated_cluster(nodes, cpus_per_node(max(runner_counts), nodes)):
            for runners in runner_counts:
                config = {"runners": runners, "nodes": nodes, "envs": args.envs[0] if args.envs else 1,
                          "ideal": round(runners / step_s)}
                overrides = workload(runners, config["envs"], step_s=step_s, train_every=args.train_every,
                                     extra=args.set)
                cells.append(results.add("efficiency", measure(config, overrides, args.seconds), list(config)[:3]))
    print(f"\nscaling efficiency, env step {step_s * 1e3:g} ms (ideal: runners / step):")
    show_cells(cells, ["runners", "nodes", "envs"])


def part_gpu(args: argparse.Namespace, results: Results) -> None:
    cells = []
    runners = (args.runners or [32])[0]
    nodes = (args.nodes or [4])[0]
    with simulated_cluster(nodes, cpus_per_node(runners, nodes)):
        for mode in args.modes:
            for utd in args.utd or [1, 2, 4, 8]:
                config = {"runners": runners, "nodes": nodes, "batch": 8192, "utd": utd, "mode": mode}
                overrides = workload(runners, 1, step_s=args.step_s, update_s=LEANRL_H100_SAC_UPDATE_S, batch=8192,
                                     utd=utd, train_every=args.train_every, extra=[f"runtime.mode={mode}", *args.set])
                cells.append(results.add("gpu", measure(config, overrides, args.seconds), list(config)))
    print(f"\na simulated GPU learner ({LEANRL_H100_SAC_UPDATE_S * 1e3:g} ms per update), env step "
          f"{args.step_s * 1e3:g} ms:")
    show_cells(cells, ["runners", "nodes", "batch", "utd", "mode"])


def part_replay(args: argparse.Namespace, results: Results) -> None:
    """The replay actor on a worker node, the driver on the head: each call crosses nodes."""
    import ray
    from _common import random_transitions

    from aa_ray.runtime.replay import ReplayBuffer

    obs_dim, act_dim, chunk_rows = 17, 6, 32 * 32  # a 32-runner iteration of train_every 32
    rows = []
    with simulated_cluster(2, 4):
        ray.init(address=os.environ["RAY_ADDRESS"])
        worker = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != ray.get_runtime_context()
                      .get_node_id())
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        on_worker = NodeAffinitySchedulingStrategy(worker, soft=False)
        replay = ray.remote(ReplayBuffer).options(num_cpus=1, scheduling_strategy=on_worker).remote(
            1_000_000, obs_dim, act_dim, seed=0)
        chunk = ray.put(random_transitions(chunk_rows, obs_dim, act_dim))
        ray.get(replay.add.remote(random_transitions(200_000, obs_dim, act_dim)))
        row_bytes = sum(a.nbytes for a in random_transitions(1, obs_dim, act_dim))

        def rate(call: Callable[[], Any], calls: int) -> float:
            call()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            return calls / (time.perf_counter() - start)

        adds = rate(lambda: ray.get(replay.add.remote(chunk)), 50)
        rows.append(["add", chunk_rows, round(adds, 1), round(adds * chunk_rows), round(adds * chunk_rows * row_bytes
                                                                                       / 2**20, 1)])
        for batch in (256, 8192):
            for num_batches in (1, 32):
                def sample(n: int = num_batches, b: int = batch) -> Any:
                    return ray.get(replay.sample_for_learners.remote(n, b, 1))
                calls = rate(sample, 20 if batch * num_batches > 100_000 else 100)
                sampled = calls * num_batches * batch
                rows.append([f"sample {num_batches} x {batch}", num_batches * batch, round(calls, 1),
                             round(sampled), round(sampled * row_bytes / 2**20, 1)])
        local = ReplayBuffer(1_000_000, obs_dim, act_dim, seed=0)
        local.add(random_transitions(200_000, obs_dim, act_dim))
        in_process = rate(lambda: local.sample(1, 8192), 200)
        rows.append(["sample 1 x 8192 in process", 8192, round(in_process, 1), round(in_process * 8192),
                     round(in_process * 8192 * row_bytes / 2**20, 1)])
        ray.shutdown()
    print_table(["call", "rows per call", "calls/s", "rows/s", "MB/s"], rows)
    results.put("replay", [dict(zip(["call", "rows_per_call", "calls_per_s", "rows_per_s", "mb_per_s"], r, strict=True))
                           for r in rows])


def part_runner(args: argparse.Namespace, results: Results) -> None:
    """One env runner in this process, zero-cost env: its CPU per vector step and per env, the
    constants c_act and c_env of the capacity model (benchmarks/scale_model.py). Each row is also
    timed with the runner acting through its torch policy instead of its numpy copy
    (aa_ray/nets/numpy_acting.py), the two interleaved: the ratio is what that copy saves."""
    import torch

    from aa_ray.runtime.env_runner import EnvRunner
    from aa_ray.spec.loader import load_spec

    torch.set_num_threads(1)  # as in a runner actor (runners.torch_threads)
    rows = []
    for envs, step_s in ((1, 0.0), (16, 0.0), (16, args.step_s)):
        runner = EnvRunner(load_spec(SPEC, workload(1, envs, step_s=step_s)), 0)
        numpy_act = runner.numpy_act
        runner.sample(10, False)
        steps = 2000 // envs if step_s == 0 else 50
        cpu = {"numpy": [], "torch": []}
        for _ in range(3):
            for acting in cpu:
                runner.numpy_act = numpy_act if acting == "numpy" else None
                cpu[acting].append(timed_cpu(lambda n=steps, r=runner: r.sample(n, False)) / (steps * envs))
        ours, torch_acting = min(cpu["numpy"]), min(cpu["torch"])
        rows.append({"envs": envs, "step_s": step_s, "cpu_us_per_transition": round(ours * 1e6, 1),
                     "acting_in_torch_us": round(torch_acting * 1e6, 1),
                     "torch_over_numpy": round(torch_acting / ours, 2)})
    one, many, sleeping = (row["cpu_us_per_transition"] for row in rows)
    c_env = (many * 16 - one) / 15  # per env per step
    c_act = one - c_env  # per vector step
    c_sleep = sleeping - many  # what the kernel charges a step for its sleep (timer, wake-up)
    print_table(["envs per runner", "env step s", "CPU us per transition", "acting in torch", "ratio"],
                [[r["envs"], r["step_s"], r["cpu_us_per_transition"], r["acting_in_torch_us"], r["torch_over_numpy"]]
                 for r in rows])
    print(f"c_act (per vector step) {c_act:.1f} us, c_env (per env per step) {c_env:.1f} us, CPU of a "
          f"{args.step_s * 1e3:g} ms sleep {c_sleep:.1f} us")
    results.put("runner", [*rows, {"c_act_us": round(c_act, 1), "c_env_us": round(c_env, 1),
                                   "c_sleep_us": round(c_sleep, 1)}])


def timed_cpu(call: Callable[[], Any]) -> float:
    start = time.process_time()
    call()
    return time.process_time() - start


def part_tiny(args: argparse.Namespace, results: Results) -> None:
    """What CI runs: 2 nodes, 4 runners, a 1 ms env step and a 1 ms update, a few seconds of learning."""
    with simulated_cluster(2, cpus_per_node(4, 2)):
        config = {"runners": 4, "nodes": 2, "envs": 2, "ideal": round(4 / 1e-3)}
        overrides = workload(4, 2, step_s=1e-3, update_s=1e-3, train_every=16, extra=args.set)
        results.add("tiny", measure(config, overrides, args.seconds, settle_s=0.5), list(config)[:3])


PARTS: dict[str, Callable[[argparse.Namespace, Results], None]] = {
    "ceiling": part_ceiling, "efficiency": part_efficiency, "gpu": part_gpu, "replay": part_replay,
    "runner": part_runner, "tiny": part_tiny,
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=[*PARTS, "all"], default="tiny")
    parser.add_argument("--seconds", type=float, default=8.0, help="learning seconds per cell")
    parser.add_argument("--runners", type=int, nargs="*", help="runner counts (default per part)")
    parser.add_argument("--envs", type=int, nargs="*", help="envs per runner (default per part)")
    parser.add_argument("--nodes", type=int, nargs="*", help="node counts (default per part)")
    parser.add_argument("--utd", type=int, nargs="*", help="UTD ratios (gpu part)")
    parser.add_argument("--modes", nargs="*", default=["sync", "async"], help="runtime.mode values (gpu part)")
    parser.add_argument("--step-s", type=float, default=2e-3, help="the env step's cost (efficiency, gpu)")
    parser.add_argument("--train-every", type=int, default=32, help="fleet steps per iteration (algo.train_every)")
    parser.add_argument("--set", nargs="*", default=[], help="extra spec overrides for every cell (key=value)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    os.chdir(REPO)  # the spec's env.py_modules is relative to the repository root
    info = machine_info()
    print_machine(info)
    parts = list(PARTS) if args.part == "all" else [args.part]
    results = Results(args.json, {"machine": info, "command": command_line(), "args": vars(args)})
    for part in parts:
        print(f"\n## {part}", flush=True)
        PARTS[part](args, results)


if __name__ == "__main__":
    if sys.argv[1:] == ["--speed-probe"]:
        run_speed_probe()
    else:
        main()
