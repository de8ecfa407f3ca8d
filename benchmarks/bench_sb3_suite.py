"""Stable-Baselines3's SAC side by side with a suite's aa-ray runs: the same envs, seeds, budget and
evaluation protocol, logged as child runs of the suite's MLflow parent, so `aa-ray report --parent`
and the MLflow UI's Compare view line the two up.

Equal settings: each SB3 run copies the suite's `--spec-label` cell (default `sac`) for that env and
seed: network widths, learning rate (SB3 has one for actor, critics and temperature, so the cell's
must agree), batch size, replay size, random warm-up (`learning_starts`), gamma, tau, one gradient
step per env step, temperature learned from 1.0 toward -|A|. Evaluation as the suite's runs do it:
every `eval.every_env_steps`, `eval.episodes` deterministic episodes, each on a fresh env reset with
aa-ray's eval seeds for that seed (`aa_ray.seeding.eval_env_seeds`), so both face the same starts.

Wall-clock time is recorded as aa-ray's runs record it, so the report's time axis and its "minutes
to reach X" column treat both alike: each evaluation is logged when it has finished, `env/steps`
every few seconds while training (so a resumed run's stopped time, from its last logged point to
its `run/resumed_at` marker, is left out), and the run's tags name the CPU and host it ran on.

A run that finished is not run again (its child run is FINISHED); `--jobs 2` runs two at once. A run
saves its model, optimizers and replay buffer every `checkpoint.every_env_steps` under the suite's
folder (`sb3/<run>/`), and an interrupted one resumes from there into the same child run. (Not
bit-exact, unlike aa-ray's resume: the episode in progress restarts and the RNGs are not restored.)
Start it after `aa-ray suite` has made the suite's parent run, or before, not at the same moment on
a new SQLite store: two processes creating MLflow's tables at once collide (alembic's migration).

Run:  .venv/bin/python benchmarks/bench_sb3_suite.py specs/suites/mujoco_cpu.yaml [--jobs 2]
      [--envs Hopper-v5] [--seeds 0 1] [--env-steps N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from aa_ray import metric_names as m
from aa_ray import seeding
from aa_ray.tracking.machine import machine_tags
from aa_ray.tracking.mlflow_tracker import PARENT_TAG, log_in_batches, retry_locked, start_run
from aa_ray.tracking.suite_report import ENV_TAG, LABEL_TAG
from aa_ray.tune.specs import cell_name, load_suite
from aa_ray.tune.suite import SEED_TAG, open_parent, suite_root

LABEL = "sb3_sac"
CONTENDER_TAG = "aa_ray.contender_cell"  # not the suite's own cell tag: the suite must not supersede these
HEARTBEAT_S = 5.0  # env/steps this often, as aa-ray's driver logs it: the last sign of life before a stop


def sb3_settings(spec: Any) -> dict[str, Any]:
    """SB3 SAC keyword arguments equal to an aa-ray sac spec; refuses what SB3 cannot match."""
    algo = spec.algo
    if algo.name != "sac":
        raise SystemExit(f"--spec-label must name a sac cell (this one is {algo.name})")
    if not algo.actor_lr == algo.critic_lr == algo.alpha_lr:
        raise SystemExit(f"SB3 uses one learning rate; the cell has actor {algo.actor_lr}, critic {algo.critic_lr}, "
                         f"alpha {algo.alpha_lr}")
    if algo.target_entropy is not None or algo.target_entropy_per_dim != -1.0 or not algo.autotune_alpha:
        raise SystemExit("SB3's automatic temperature aims at -|A|: the cell must learn alpha toward that too")
    if algo.actor_hidden_dims != algo.critic_hidden_dims:
        raise SystemExit("this comparison needs the same actor and critic widths (SB3's net_arch list)")
    return {
        "learning_rate": algo.actor_lr, "buffer_size": algo.buffer_size, "learning_starts": algo.warm_up_steps,
        "batch_size": algo.batch_size, "tau": algo.tau, "gamma": algo.gamma, "train_freq": 1,
        "gradient_steps": algo.utd_ratio, "ent_coef": f"auto_{algo.init_alpha}", "target_entropy": "auto",
        "policy_kwargs": {"net_arch": list(algo.actor_hidden_dims)},
    }


def evaluate(model: Any, env_id: str, seed: int, episodes: int) -> float:
    import gymnasium as gym

    env = gym.make(env_id)
    returns = []
    for episode_seed in seeding.eval_env_seeds(seed, episodes):
        obs, _ = env.reset(seed=episode_seed)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


STATE_FILE = "state.json"


def save_checkpoint(model: Any, folder: Path, run_id: str) -> None:
    """Model (with optimizers and temperature), replay buffer and the child run's id, replacing the
    previous checkpoint only once the new one is whole."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save(partial / "model.zip")
    model.save_replay_buffer(partial / "replay.pkl")
    (partial / STATE_FILE).write_text(json.dumps({"run_id": run_id, "env_steps": int(model.num_timesteps)}))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One SB3 run, logged into its MLflow child run as it goes (eval/return at env steps)."""
    import gymnasium as gym
    import torch
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    client = MlflowClient(tracking_uri=job["uri"])
    folder = Path(job["checkpoint_dir"])
    state = json.loads((folder / STATE_FILE).read_text()) if job["resume"] else None
    if state is None:  # when it starts, not while it waits its turn
        run_id = start_run(client, job["experiment"], job["tags"])
        log_in_batches(client, run_id, params=[Param(k, v[:6000]) for k, v in job["params"].items()])
    else:
        run_id = state["run_id"]
        print(f"{job['cell']}: resuming from {state['env_steps']:,} env steps", flush=True)
    every, episodes, budget, save_every = job["eval_every"], job["episodes"], job["env_steps"], job["checkpoint_every"]
    started = time.perf_counter()

    class Evaluations(BaseCallback):
        def __init__(self, done_steps: int) -> None:
            super().__init__()
            self.next_eval = (done_steps // every + 1) * every
            self.next_save = (done_steps // save_every + 1) * save_every
            self.phase_start: tuple[float, int] | None = None
            self.next_heartbeat = time.monotonic() + HEARTBEAT_S

        def _on_step(self) -> bool:
            steps = self.num_timesteps
            if self.phase_start is None and steps >= job["settings"]["learning_starts"]:
                self.phase_start = (time.perf_counter(), steps)
            if steps >= self.next_eval:
                self.next_eval += every
                self.log_evaluation()
            if steps >= self.next_save and steps < budget:
                self.next_save += save_every
                save_checkpoint(self.model, folder, run_id)
            if time.monotonic() >= self.next_heartbeat:
                self.next_heartbeat = time.monotonic() + HEARTBEAT_S
                retry_locked(lambda: client.log_metric(run_id, m.ENV_STEPS, steps, step=steps))
            return True

        def _on_training_end(self) -> None:  # aa-ray also evaluates once more at the end of the budget
            if self.num_timesteps > self.next_eval - every:
                self.log_evaluation()

        def log_evaluation(self) -> None:
            steps = self.num_timesteps
            value = evaluate(self.model, job["env"], job["seed"], episodes)
            now = int(time.time() * 1000)  # when the return is known, as aa-ray's evaluations are logged
            # the learner's count as aa-ray's learner logs it: the report counts evaluations from the first update
            metrics = [Metric(m.EVAL_RETURN, value, now, steps), Metric(m.ENV_STEPS, steps, now, steps),
                       Metric(m.LEARNER_GRADIENT_UPDATES, float(self.model._n_updates), now, steps)]
            if self.phase_start is not None and steps > self.phase_start[1]:
                rate = (steps - self.phase_start[1]) / (time.perf_counter() - self.phase_start[0])
                metrics.append(Metric(m.ENV_STEPS_PER_S, rate, now, steps))
            retry_locked(lambda: client.log_batch(run_id, metrics=metrics))
            print(f"{job['cell']}: {steps:,} env steps, {m.EVAL_RETURN} {value:.1f}", flush=True)

    env = gym.make(job["env"])
    if state is None:
        model = SAC("MlpPolicy", env, seed=job["seed"], device="cpu", verbose=0, **job["settings"])
    else:
        model = SAC.load(folder / "model.zip", env=env, device="cpu")
        model.load_replay_buffer(folder / "replay.pkl")
        # as aa-ray's resumes: at the checkpoint's step, once restored (restoring is stopped time in both)
        retry_locked(lambda: client.log_metric(run_id, m.RUN_RESUMED_AT, state["env_steps"], step=state["env_steps"]))
    done_steps = model.num_timesteps
    model.learn(budget - done_steps, callback=Evaluations(done_steps), reset_num_timesteps=state is None)
    retry_locked(lambda: client.set_terminated(run_id))
    shutil.rmtree(folder, ignore_errors=True)  # finished: its child run holds the result
    return {"cell": job["cell"], "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", type=Path)
    parser.add_argument("--spec-label", default="sac", help="the suite's label whose settings SB3 copies")
    parser.add_argument("--envs", nargs="+", help="only these env ids (default: the suite's)")
    parser.add_argument("--seeds", nargs="+", type=int, help="only these seeds (default: the suite's)")
    parser.add_argument("--env-steps", type=int, help="a budget other than the cells' (a smoke test)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (one core each)")
    parser.add_argument("--smoke", action="store_true", help="the first cell alone, 400 env steps (what CI runs)")
    args = parser.parse_args()
    if args.smoke:
        args.env_steps = args.env_steps or 400
    suite = load_suite(args.suite)
    from aa_ray.spec.loader import flatten, validate_spec
    from aa_ray.tune.parent import absolute_paths

    cells = [cell for cell in suite.cells.values() if cell["label"] == args.spec_label
             and (not args.envs or cell["env"] in args.envs) and (args.seeds is None or cell["seed"] in args.seeds)]
    if not cells:
        raise SystemExit(f"the suite has no {args.spec_label!r} cells for those envs and seeds")
    cells = cells[:1] if args.smoke else cells
    specs = [validate_spec(absolute_paths(cell["raw"])) for cell in cells]
    parent = open_parent(suite, suite_root(suite), specs[0])
    if parent is None:
        raise SystemExit("the suite's specs turn tracking off; there is no MLflow parent run to log into")
    import stable_baselines3

    children = parent.children()
    done = {child.data.tags.get(CONTENDER_TAG) for child in children if child.info.status == "FINISHED"}
    jobs = []
    for cell, spec in zip(cells, specs, strict=True):
        name = cell_name(LABEL, cell["env"], cell["seed"])
        if name in done:
            print(f"{name}: finished earlier")
            continue
        folder = suite_root(suite) / "sb3" / name
        saved = json.loads((folder / STATE_FILE).read_text()) if (folder / STATE_FILE).is_file() else None
        for child in children:  # an interrupted run without a checkpoint starts over
            if child.data.tags.get(CONTENDER_TAG) == name and child.info.run_id != (saved or {}).get("run_id"):
                retry_locked(lambda run_id=child.info.run_id: parent.client.delete_run(run_id))
        resume = saved is not None and any(child.info.run_id == saved["run_id"] for child in children)
        settings = sb3_settings(spec)
        tags = {**parent.tags, **machine_tags(), PARENT_TAG: parent.run_id,
                "mlflow.runName": f"{suite.spec.name}:{name}", LABEL_TAG: LABEL, ENV_TAG: cell["env"],
                SEED_TAG: str(cell["seed"]), CONTENDER_TAG: name}
        params = {**{k: str(v) for k, v in flatten(spec.model_dump(mode="json")).items()},
                  "algo.name": "sac", "contender": f"stable-baselines3 {stable_baselines3.__version__}",
                  "sb3.settings": json.dumps(settings)}
        jobs.append({"cell": name, "env": cell["env"], "seed": cell["seed"], "settings": settings,
                     "env_steps": args.env_steps or spec.budget.env_steps, "eval_every": spec.eval.every_env_steps,
                     "episodes": spec.eval.episodes, "uri": parent.uri, "experiment": spec.tracking.experiment,
                     "tags": tags, "params": params, "checkpoint_dir": str(folder), "resume": resume,
                     "checkpoint_every": spec.checkpoint.every_env_steps or spec.eval.every_env_steps})
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(run_one, jobs):
            print(f"{result['cell']}: done in {result['seconds']:.0f} s", flush=True)
    print(f"report: aa-ray report --parent {parent.run_id}")


if __name__ == "__main__":
    sys.exit(main())
