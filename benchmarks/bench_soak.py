"""Soak: one long SAC run on Pendulum-v1 with 4 env runners, sampling the memory of every process.

A long run must not grow: once the replay buffer is full (its numpy arrays are preallocated, and
their pages are committed as rows are first written), every actor's memory should stay flat, and
the object store should hold only the refs in flight (chunks, sampled batches, weights). The run
uses a replay capacity well below the budget, so most of it is spent on the plateau. A background
thread samples, every `--interval` seconds:

- the RSS and USS (private memory) of every live actor process of the run (EnvRunner, ReplayBuffer,
  Learner; pids from Ray's state API), of the driver and of Ray's raylet and GCS server;
- the object store: objects referenced and their size (`ray.util.state.summarize_objects`) and the
  raylet's shared-memory (plasma) usage (`memory_summary(stats_only=True)`);
- env steps and replay size, read from the Trainer.

The run: specs/sac_pendulum.yaml, 4 runners x 2 envs, async mode, MLflow tracking into a temporary
store, evaluation every quarter of the budget and one checkpoint (with the replay) half way.
Reported per process kind: memory when the replay first reached capacity vs at the end of the run,
how much of that growth was the one step across the mid-run checkpoint, the maximum, and the slope
of a straight-line fit after the checkpoint (MB per 100k env steps); the object store at start,
fill, max and end, after `Trainer.run` returns and once the Trainer is deleted; and how many task
records the GCS holds at the end (Ray's task events, which the GCS keeps up to a fixed count).

Run (about 10 minutes on the 2-core machine):
    .venv/bin/python benchmarks/bench_soak.py [--env-steps 200000] [--mode async] [--json soak.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
from ray.util.state import list_actors, summarize_objects
from ray.util.state.api import StateApiClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SPECS, add_smoke, command_line, machine_info, print_machine, print_table, write_json  # noqa: E402

from aa_ray.envs import env_dims  # noqa: E402
from aa_ray.runtime.cluster import TASK_EVENTS_KEPT  # noqa: E402
from aa_ray.runtime.trainer import Trainer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

MB = 2**20
RAY_SYSTEM = ("raylet", "gcs_server")


def process_memory(pid: int) -> dict[str, float] | None:
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return None
    return {"rss_mb": info.rss / MB, "uss_mb": info.uss / MB}


def object_store(address: str) -> dict[str, Any]:
    summary = summarize_objects(address=address, raise_on_missing_output=False)["cluster"]
    kinds: dict[str, int] = {}
    for group in summary["summary"].values():
        for kind, count in group["ref_type_counts"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    store = {"objects": summary["total_objects"], "objects_mb": summary["total_size_mb"], "ref_types": kinds}
    try:  # the raylet's own count of what sits in shared memory (internal API, MiB resolution)
        from ray._private.internal_api import memory_summary

        found = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", memory_summary(address, stats_only=True))
        if found:
            store |= {"plasma_mb": int(found[1]), "plasma_objects": int(found[2])}
    except Exception:  # best effort; the public numbers above are the result
        pass
    return store


def gcs_task_records(address: str) -> int | None:
    """How many task records (Ray's task events) the GCS holds. The public `summarize_tasks` stops
    counting at 10,000; the list endpoint's `total` does not (a private client method: best effort)."""
    try:
        reply = StateApiClient(address)._make_http_get_request("/api/v0/tasks", {"limit": 1, "detail": False}, 30)
        return int(reply["total"])
    except Exception:  # best effort, as above
        return None


def sample(address: str, trainer: Trainer | None, start: float) -> dict[str, Any]:
    """One snapshot: memory per process ("Kind:pid"), the object store, and the run's progress. The
    state API gets this Ray's address: another process on the host (a test) may run its own."""
    procs: dict[str, dict[str, float]] = {}
    for actor in list_actors(address, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False):
        if (memory := process_memory(actor.pid)) is not None:
            procs[f"{actor.class_name}:{actor.pid}"] = memory
    driver = psutil.Process()
    procs[f"driver:{driver.pid}"] = process_memory(driver.pid) or {}
    for child in driver.children(recursive=True):
        if child.name() in RAY_SYSTEM and (memory := process_memory(child.pid)) is not None:
            procs[f"{child.name()}:{child.pid}"] = memory
    return {
        "t_s": round(time.perf_counter() - start, 1),
        "env_steps": trainer.counters.env_steps if trainer else 0,
        "replay_size": trainer.replay_size if trainer else 0,
        "procs": procs,
        **object_store(address),
    }


def sampler(
    address: str, trainer: Trainer, start: float, interval: float, samples: list[dict], stop: threading.Event
) -> None:
    while not stop.wait(interval):
        try:
            samples.append(sample(address, trainer, start))
        except Exception as err:  # a failed snapshot must not end the soak
            print(f"# sample failed: {type(err).__name__}: {err}", flush=True)


def mean_at(sample: dict, names: list[str], key: str) -> float:
    """The mean over the processes this sample caught (psutil can miss one for a moment); nan if none."""
    values = [sample["procs"][name][key] for name in names if name in sample["procs"]]
    return float(np.mean(values)) if values else float("nan")


def memory_rows(samples: list[dict], fill: int, ckpt: int, key: str) -> list[list[Any]]:
    """Per process kind, the mean over its processes: memory when the replay filled and at the end, the
    growth between them and how much of it was the one step across the mid-run checkpoint (from
    sample `ckpt`, the last before it, to two samples later, so the checkpoint has finished), the
    rest, the max, and the slope of a line fitted from there to the end."""
    kinds: dict[str, list[str]] = {}
    for name in samples[-1]["procs"]:
        if name in samples[fill]["procs"]:  # alive from the fill to the end
            kinds.setdefault(name.split(":")[0], []).append(name)
    rows = []
    for kind, names in kinds.items():
        at_fill, at_end = mean_at(samples[fill], names, key), mean_at(samples[-1], names, key)
        step = mean_at(samples[ckpt + 2], names, key) - mean_at(samples[ckpt], names, key)
        tail = [(s["env_steps"], mean_at(s, names, key)) for s in samples[ckpt + 2 :]]
        tail = [(steps, value) for steps, value in tail if np.isfinite(value)]
        slope = np.polyfit(*zip(*tail, strict=True), 1)[0] if len(tail) > 1 else float("nan")
        peak = max(s["procs"][n][key] for s in samples for n in names if n in s["procs"])
        growth = at_end - at_fill
        rows.append([f"{kind} x{len(names)}", at_fill, at_end, growth, 100 * growth / at_fill, step,
                     growth - step, peak, 100_000 * slope])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-steps", type=int, default=200_000)
    parser.add_argument("--buffer-size", type=int, default=50_000, help="replay capacity (below the budget)")
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--envs", type=int, default=2, help="envs per runner")
    parser.add_argument("--train-every", type=int, default=16)
    parser.add_argument("--mode", choices=["sync", "async"], default="async")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, default=None, help="write the machine, results and raw samples here")
    add_smoke(parser)
    args = parser.parse_args()
    settle_s = 5.0  # for the processes' memory to settle before a sample
    smoke_overrides: list[str] = []
    if args.smoke:  # one runner, a replay that fills in seconds, learning from 300 steps with 32 x 32 nets
        # (256 x 256 updates were a fifth of its CPU), two samples a second: samples past the fill and the
        # checkpoint however fast the run
        args.env_steps, args.buffer_size, args.runners, args.envs, args.interval = 900, 300, 1, 1, 0.5
        settle_s = 1.0
        smoke_overrides = ["algo.warm_up_steps=300", "eval.episodes=2",
                           "algo.actor_hidden_dims=[32, 32]", "algo.critic_hidden_dims=[32, 32]"]
    info = machine_info()
    print_machine(info)
    print(f"# command: {command_line()}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="aa_ray_soak_"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
    spec = load_spec(SPECS / "sac_pendulum.yaml", [
        f"runners.num_runners={args.runners}", f"runners.envs_per_runner={args.envs}",
        f"budget.env_steps={args.env_steps}", f"algo.buffer_size={args.buffer_size}",
        f"algo.train_every={args.train_every}", f"runtime.mode={args.mode}",
        f"eval.every_env_steps={args.env_steps // 4}", f"checkpoint.every_env_steps={args.env_steps // 2}",
        f"runtime.output_dir={tmp}/runs", *smoke_overrides,
    ])
    obs, act_dim = env_dims(spec)
    obs_dim = obs.full
    row_bytes = 4 * (2 * obs_dim + act_dim + 5)  # float32: obs, next_obs, action and 5 scalar fields
    replay_mb = spec.algo.buffer_size * row_bytes / MB
    # started here, first, so the sampler can see it; Trainer.run's cluster.connect reuses it. The smoke cell
    # also leaves out the idle workers Ray starts for the first driver, as cluster.connect does: a second of CPU
    system_config = {"task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT}  # as cluster.connect does
    if args.smoke:
        system_config["prestart_worker_first_driver"] = False
    ray.init(address="local", num_cpus=8, include_dashboard=True, _system_config=system_config)
    address = ray.get_runtime_context().gcs_address
    job_id = ray.get_runtime_context().get_job_id()
    start = time.perf_counter()
    before = sample(address, None, start)
    trainer = Trainer(spec, track=True, live=False)
    samples: list[dict] = []
    stop = threading.Event()
    thread = threading.Thread(target=sampler, args=(address, trainer, start, args.interval, samples, stop), daemon=True)
    thread.start()
    result = trainer.run()
    stop.set()
    thread.join()
    wall = time.perf_counter() - start
    reused = ray.is_initialized()  # a Ray the Trainer had started itself would be shut down by now
    actor_jobs = {a.job_id for a in list_actors(address, raise_on_missing_output=False)}
    time.sleep(settle_s)
    after_run = sample(address, trainer, start)
    records = gcs_task_records(address)  # once, at the end: listing them makes the GCS allocate
    task_cap = ray._config.task_events_max_num_task_in_gcs()  # Ray's bound on the task records the GCS keeps
    del trainer
    gc.collect()
    time.sleep(settle_s)
    after_del = sample(address, None, start)
    ray.shutdown()

    fill = next(i for i, s in enumerate(samples) if s["replay_size"] >= spec.algo.buffer_size)
    ckpt = max(i for i, s in enumerate(samples) if s["env_steps"] < spec.checkpoint.every_env_steps)
    print(f"\n{len(samples)} samples over {wall:.0f} s; {result.env_steps:,} env steps "
          f"({result.env_steps / wall:.0f}/s), stop: {result.stop_reason}, replay {result.replay_size:,} "
          f"full at {samples[fill]['env_steps']:,} env steps; the run's actors were in this job ({job_id}): "
          f"{actor_jobs == {job_id}}; Ray still up after the run: {reused}")
    print(f"replay arrays: {spec.algo.buffer_size:,} rows x {row_bytes} B = {replay_mb:.2f} MB; checkpoint "
          f"between {samples[ckpt]['env_steps']:,} and {samples[ckpt + 2]['env_steps']:,} env steps")
    gcs = [v["rss_mb"] for s in (samples[0], samples[-1]) for k, v in s["procs"].items() if k.startswith("gcs_server")]
    per_record = (gcs[1] - gcs[0]) * MB / records if records else float("nan")
    print(f"task records the GCS holds after the run: {records} (Ray keeps at most {task_cap:,}); GCS RSS "
          f"{gcs[0]:.0f} -> {gcs[1]:.0f} MB over the run, {per_record:,.0f} B per task record")
    results: dict[str, Any] = {"result": asdict(result), "wall_s": wall,
                               "ray_reused": reused and actor_jobs == {job_id}, "replay_array_mb": replay_mb,
                               "fill_sample": fill, "checkpoint_sample": ckpt,
                               "gcs_task_records": records, "gcs_task_cap": task_cap,
                               "gcs_bytes_per_task_record": per_record}
    headers = ["process", "at fill MB", "at end MB", "growth MB", "growth %", "of it at checkpoint MB",
               "rest MB", "max MB", "slope after checkpoint, MB/100k steps"]
    for key in ("rss_mb", "uss_mb"):
        print(f"\n{key[:3].upper()}, mean per process of a kind:")
        results[key] = memory_rows(samples, fill, ckpt, key)
        print_table(headers, results[key])
    store_keys = ("objects", "objects_mb", "plasma_objects", "plasma_mb")
    points = {"before run": before, "first sample": samples[0], "at fill": samples[fill],
              "end of run": samples[-1], "after run returned": after_run, "after del trainer": after_del}
    rows = [[name, s["env_steps"], *(s.get(k, "-") for k in store_keys), s["ref_types"]] for name, s in points.items()]
    rows.append(["max during run", "", *(max(s.get(k, 0) for s in samples) for k in store_keys), ""])
    print("\nobject store:")
    print_table(["when", "env steps", *store_keys, "ref types"], rows)
    results["object_store"] = rows
    write_json(args.json, {"machine": info, "command": command_line(), **results,
                           "samples": [before, *samples, after_run, after_del]})


if __name__ == "__main__":
    main()
