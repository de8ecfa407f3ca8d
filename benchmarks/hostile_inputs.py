"""Issue 34's hostile inputs, re-run as a user and an attacker would: each case is one `aa-ray` command
on files this script plants in a scratch folder (a command hidden in a checkpoint, a dataset, a model;
a spec that validated and then failed; a full disk). For each it records the exit code, whether the
command said what went wrong in one message (no traceback, no Python warning noise), whether planted
code ran (a marker file), and what was left behind. The cases that need signals, a Tune suite or a
training run are covered by the tests named in RESULTS section 21 instead.

    .venv/bin/python benchmarks/hostile_inputs.py [--out benchmarks/results/hostile_inputs.json]

Needs root for the full-disk cases (a 6 MiB tmpfs is mounted and unmounted); they are skipped
otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
AA_RAY = str(Path(sys.executable).parent / "aa-ray")
SMALL = ["algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]", "runners.num_runners=1",
         "runners.envs_per_runner=1", "tracking.enabled=false", "runtime.backend=inline"]
MINIMAL = "name: t\nenv: {id: Pendulum-v1}\nalgo: {name: sac, warm_up_steps: 100}\nbudget: {env_steps: 1000}\n" \
          "tracking: {enabled: false}\n"


@dataclass
class Outcome:
    case: str
    exit_code: int
    one_message: bool  # stderr is the command's own error, nothing else (no traceback, no warning lines)
    traceback: bool
    code_ran: bool
    secret_shown: bool
    left_behind: list[str]
    said: str  # the message's first 160 characters
    seconds: float
    expected_exit: int = 2

    @property
    def handled(self) -> bool:
        """Refused in one message (or, where success is right, done) with no code run, no secret shown
        and nothing left behind."""
        said_well = self.one_message if self.expected_exit else not self.traceback
        return (self.exit_code == self.expected_exit and said_well and not self.code_ran and not self.secret_shown
                and not self.left_behind)


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def run_case(case: str, argv: list[str], cwd: Path, marker: Path, watch: Path | None = None,
             env: dict[str, str] | None = None, secret: str | None = None, expect: int = 2) -> Outcome:
    """Run one command; `marker` exists only if planted code ran (removed again for the next case),
    `watch` is a folder whose contents afterwards are what was left behind, `secret` must not be shown."""
    started = time.perf_counter()
    done = subprocess.run([AA_RAY, *argv], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    err = done.stderr.strip()
    lines = [line for line in err.splitlines() if line.strip()]
    own = bool(lines) and lines[0].startswith("aa-ray: error:") and not any(
        "Warning" in line or line.startswith(("Traceback", "W1", "E1")) for line in lines)
    left = sorted(str(p.relative_to(watch)) for p in watch.rglob("*") if p.name != "ballast") if watch else []
    ran = marker.exists()
    marker.unlink(missing_ok=True)
    shown = bool(secret) and secret in done.stdout + done.stderr
    return Outcome(case, done.returncode, own, "Traceback" in err, ran, shown, left, " ".join(lines)[:160],
                   round(time.perf_counter() - started, 1), expect)


def planted_checkpoint(scratch: Path, marker: Path, env: dict | None = None, name: str = "theirs_ckpt") -> Path:
    """A real pusher-reach checkpoint whose stored spec's env section was updated with `env` (default:
    make the env with os.system), edited as an attacker would, with torch alone."""
    from aa_ray.records import CheckpointParts, DriverCheckpoint, RunCounters
    from aa_ray.runtime.checkpoint import STATE_FILE, save_checkpoint
    from aa_ray.runtime.learner import Learner
    from aa_ray.spec.loader import load_spec

    spec = load_spec(SPECS / "sac.yaml", SMALL)
    state = CheckpointParts(learner=Learner(spec, 10, 2).state_dict(),
                            driver=DriverCheckpoint(RunCounters(0, 0, 0, next_eval=1000), [], [], {}))
    folder = save_checkpoint(scratch / name, spec, state)
    plant_spec(folder / STATE_FILE, env or {"entry_point": "os:system", "kwargs": {"command": f"touch {marker}"}})
    return folder


def plant_spec(state_file: Path, env: dict) -> None:
    payload = torch.load(state_file, weights_only=True)
    payload["spec"]["env"].update(env)
    torch.save(payload, state_file)


def marker_package(scratch: Path, marker: Path) -> Path:
    """A package whose import runs the planted command."""
    package = scratch / "marker_pkgs" / "marker_mod"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(f"import os\nos.system('touch {marker}')\nMIRROR = {{}}\n")
    return package


def logged_model_uris(scratch: Path, marker: Path) -> tuple[Path, dict[str, str]]:
    """An MLflow store in `scratch` (mlflow.db, its artifacts beside it) holding a run that logged a
    policy model whose checkpoint's spec makes the env through aa-ray's own module and os.system, the
    model registered as `theirs`: the model folder and the runs:/ and models:/ URIs."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from aa_ray.runtime.checkpoint import MODEL_POLICY_FOLDER, STATE_FILE, policy_only, save_checkpoint
    from aa_ray.runtime.learner import Learner
    from aa_ray.spec.loader import load_spec
    from aa_ray.tracking.models import save_policy_model

    spec = load_spec(SPECS / "sac.yaml", SMALL)
    policy = Learner(spec, 10, 2).algo.policy_state()
    folder = scratch / "theirs_own_prefix_model"
    save_policy_model(spec, policy, folder, "policy", 0)
    save_checkpoint(folder / MODEL_POLICY_FOLDER, spec, policy_only(policy))
    plant_spec(folder / MODEL_POLICY_FOLDER / STATE_FILE,
               {"entry_point": "aa_ray.envs.source:os.system", "kwargs": {"command": f"touch {marker}"}})
    here = Path.cwd()
    os.chdir(scratch)  # the store's default artifact root is beside it
    try:
        mlflow.set_tracking_uri(f"sqlite:///{scratch / 'mlflow.db'}")
        with mlflow.start_run() as run:
            mlflow.log_artifacts(str(folder), "policy")
        client = MlflowClient()
        client.create_registered_model("theirs")
        client.create_model_version("theirs", source=f"runs:/{run.info.run_id}/policy", run_id=run.info.run_id)
    finally:
        os.chdir(here)
    return folder, {"runs:/": f"runs:/{run.info.run_id}/policy", "models:/": "models:/theirs/1"}


REPLACED_STAGE = "pipeline run again after its train stage's checkpoint was replaced (reruns the stage)"


def replaced_stage_checkpoint(scratch: Path, marker: Path) -> list[str]:
    """Issue 55's third route: a train -> rollout pipeline ran, then the train stage's final checkpoint
    was replaced by one whose spec imports a planted module. Returns the command that runs the same
    pipeline again, which must not reuse or read the replaced file (its stage runs again) and must
    not import the module."""
    package = marker_package(scratch, marker)
    pipeline = scratch / "pipeline.yaml"
    tiny = {"algo.actor_hidden_dims": [32, 32], "algo.critic_hidden_dims": [32, 32], "checkpoint.every_env_steps": None,
            "runtime.backend": "inline", "eval.every_env_steps": 500, "eval.episodes": 1, "tracking.log_model": False}
    pipeline.write_text(json.dumps({"name": "replaced", "stages": {
        "t": {"kind": "train", "spec": str(SPECS / "ppo.yaml"), "set": {**tiny, "budget.env_steps": 1024,
                                                                          "runtime.output_dir": str(scratch / "runs")}},
        "r": {"kind": "rollout", "policy": "t.checkpoint", "episodes": 2}}}))
    argv = ["pipeline", str(pipeline), "--no-track"]
    first = subprocess.run([AA_RAY, *argv], cwd=scratch, capture_output=True, text=True, timeout=900)
    if first.returncode != 0:
        raise RuntimeError(f"the pipeline's first run failed: {first.stderr[-2000:]}")
    (final,) = (scratch / "runs" / "pipelines" / "replaced").glob("t-*/checkpoints/final")
    plant_spec(final / "state.pt", {"imports": ["marker_mod"], "py_modules": [str(package)]})
    return argv


def planted_model(scratch: Path, marker: Path) -> Path:
    """An MLflow model as a run logs it, whose pyfunc loader runs a command when imported."""
    from aa_ray.runtime.checkpoint import MODEL_POLICY_FOLDER, policy_only, save_checkpoint
    from aa_ray.runtime.learner import Learner
    from aa_ray.spec.loader import load_spec
    from aa_ray.tracking.models import save_policy_model

    spec = load_spec(SPECS / "sac.yaml", SMALL)
    policy = Learner(spec, 10, 2).algo.policy_state()
    folder = scratch / "theirs_model"
    save_policy_model(spec, policy, folder, "policy", 0)
    save_checkpoint(folder / MODEL_POLICY_FOLDER, spec, policy_only(policy))
    (loader,) = (folder / "code").rglob("policy_pyfunc.py")
    loader.write_text(f"import os\nos.system('touch {marker}')\n" + loader.read_text())
    return folder


def minari_folder(scratch: Path, metadata: object) -> Path:
    folder = scratch / f"minari_{len(list(scratch.glob('minari_*')))}"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "metadata.json").write_text(json.dumps(metadata))
    return folder


def user_package(scratch: Path) -> Path:
    package = scratch / "users_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import sys\n\ndef raising_mirror():\n    raise RuntimeError('the mirror broke')\n\nNOT_A_MIRROR = 42\n")
    (package / "exits.py").write_text("import sys\nsys.exit(0)\n")
    (package / "raises.py").write_text("raise RuntimeError('the plugin broke at import')\n")
    return package


def mounted_small_disk(scratch: Path) -> Path | None:
    disk = scratch / "small_disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)], capture_output=True).returncode:
        return None
    with open(disk / "ballast", "wb", buffering=0) as ballast:
        try:
            while True:
                ballast.write(b"\0" * 2**16)
        except OSError:
            pass
    return disk


# --smoke: one case that plants code in a checkpoint and one that hides it in the user's env module
SMOKE_CASES = ("checkpoint whose spec names os:system (eval)", "mirror that raises")


def cases(scratch: Path, smoke: bool = False, only: tuple[str, ...] = ()) -> list[Outcome]:
    marker = scratch / "planted_command_ran"
    ckpt = planted_checkpoint(scratch, marker)
    model = planted_model(scratch, marker)
    package = user_package(scratch)
    spec = scratch / "spec.yaml"
    spec.write_text(MINIMAL)
    base = scratch / "base.yaml"
    base.write_text(MINIMAL)
    user = ["--set", f"env.py_modules=[{package}]"]
    env_spec = {"id": "Their-v0", "entry_point": "os:system", "kwargs": {"command": f"touch {marker}"},
                "max_episode_steps": None, "reward_threshold": None, "nondeterministic": False,
                "disable_env_checker": True, "apply_api_compatibility": False, "additional_wrappers": []}
    minari_cmd = minari_folder(scratch, {"dataset_id": "their/data-v0", "env_spec": json.dumps(env_spec),
                                         "total_episodes": 1, "total_steps": 10, "data_format": "arrow"})
    minari_list = minari_folder(scratch, [1, 2, 3])
    grid = scratch / "grid.yaml"
    grid.write_text("name: big\nbase: base.yaml\nmetric: eval/return\nsearch_space:\n"
                    + "".join(f"  algo.k{i}: {{grid: {list(range(10))}}}\n" for i in range(6)))
    suite = scratch / "suite.yaml"
    suite.write_text("name: twins\nspecs: {sac: base.yaml}\nenvs: [Pendulum-v1, pendulum-v1]\nseeds: [0]\n")
    dataset = scratch / "existing.parquet"
    results: list[Outcome] = []

    def wanted(name: str) -> bool:
        return not (smoke and name not in SMOKE_CASES or only and not any(part in name for part in only))

    def case(name: str, argv: list[str], **kwargs: object) -> None:
        if not wanted(name):
            return
        results.append(run_case(name, argv, scratch, marker=marker, **kwargs))
        print(f"{results[-1].exit_code:>3}  {name}", file=sys.stderr, flush=True)

    # 1. code from files the user did not write
    case("Minari dataset whose env_spec is os:system (validate --set algo.prior_data)",
         ["validate", str(SPECS / "rlpd.yaml"), "--set", f"algo.prior_data={minari_cmd}"])
    for command, extra in (("eval", []), ("export", ["--format", "onnx", "--out", str(scratch / "p.onnx")])):
        case(f"checkpoint whose spec names os:system ({command})", [command, str(ckpt), *extra])
    case("checkpoint whose spec names os:system (rollout --checkpoint)",
         ["rollout", str(SPECS / "sac.yaml"), *sets(*SMALL), "--checkpoint", str(ckpt), "--episodes", "1",
          "--out", str(scratch / "r.parquet")])
    case("checkpoint whose spec names os:system (run --resume)",
         ["run", str(SPECS / "sac.yaml"), *sets(*SMALL, "budget.env_steps=400", "algo.warm_up_steps=100"),
          "--plain", "--resume", str(ckpt)])
    case("MLflow model whose pyfunc loader runs a command (eval MODEL: evaluates, runs none of it)",
         ["eval", str(model), "--episodes", "1"], expect=0)
    # 1b. issue 55's routes: aa-ray's own module prefix with a dotted walk, bytes values, and where they hide
    if not smoke:
        dotted = planted_checkpoint(scratch, marker, {"entry_point": "aa_ray.envs.source:os.system",
                                                      "kwargs": {"command": f"touch {marker}"}}, "own_prefix_ckpt")
        for command, extra in (("eval", []), ("export", ["--format", "onnx", "--out", str(scratch / "p.onnx")])):
            case(f"checkpoint whose spec names aa_ray.envs.source:os.system ({command})",
                 [command, str(dotted), *extra])
        subprocess_run = planted_checkpoint(scratch, marker, {
            "entry_point": "aa_ray.tracking.mlflow_tracker:subprocess.run", "kwargs": {"args": ["touch", str(marker)]}},
            "own_prefix_subprocess_ckpt")
        case("checkpoint whose spec names aa_ray.tracking.mlflow_tracker:subprocess.run (eval)",
             ["eval", str(subprocess_run)])
        aborts = planted_checkpoint(scratch, marker, {"mirror": "aa_ray.envs.source:os.abort"},
                                    "own_prefix_mirror_ckpt")
        case("checkpoint whose env.mirror is aa_ray.envs.source:os.abort (eval)", ["eval", str(aborts)])
        model_folder, uris = logged_model_uris(scratch, marker)
        store = {"MLFLOW_TRACKING_URI": f"sqlite:///{scratch / 'mlflow.db'}"}
        case("MLflow model folder whose policy names aa_ray.envs.source:os.system (eval)",
             ["eval", str(model_folder)])
        for kind, uri in uris.items():
            case(f"{kind} URI of that model (eval)", ["eval", uri], env=store)
        package = marker_package(scratch, marker)
        folder = str(package).encode()
        for name, env in (("env.entry_point b'os:system'",
                           {"entry_point": b"os:system", "kwargs": {"command": f"touch {marker}"}}),
                          ("env.imports [b'marker_mod'], env.py_modules [b'<its folder>']",
                           {"imports": [b"marker_mod"], "py_modules": [folder]}),
                          ("env.id b'marker_mod:X-v0', env.py_modules [b'<its folder>']",
                           {"id": b"marker_mod:X-v0", "py_modules": [folder]})):
            bytes_ckpt = planted_checkpoint(scratch, marker, env, f"bytes_{len(results)}_ckpt")
            case(f"checkpoint whose spec holds {name} (eval)", ["eval", str(bytes_ckpt)])
            if "imports" in env:
                case(f"checkpoint whose spec holds {name} (rollout --checkpoint)",
                     ["rollout", str(SPECS / "sac.yaml"), *sets(*SMALL), "--checkpoint", str(bytes_ckpt),
                      "--episodes", "1", "--out", str(scratch / "r.parquet")])
        if wanted(REPLACED_STAGE):
            case(REPLACED_STAGE, replaced_stage_checkpoint(scratch, marker), expect=0)
    # 2. secrets
    case("tracking URI foo://alice:Pa(ssW0rd@host/x (the password must not be printed)",
         ["run", str(spec), "--set", "tracking.enabled=true"],
         env={"MLFLOW_TRACKING_URI": "foo://alice:Pa(ssW0rd@host/x"}, secret="ssW0rd")
    case("tracking URI with a token in its fragment", ["run", str(spec), "--set", "tracking.enabled=true"],
         env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9/#token=s3cr3tT0k3n"}, secret="s3cr3tT0k3n")
    # 3. nothing escapes as exit 0 or a traceback
    case("env module calls sys.exit(0) at import (validate)", ["validate", str(spec), *user,
                                                                "--set", "env.imports=[users_pkg.exits]"])
    case("env module calls sys.exit(0) at import (run)", ["run", str(spec), *user,
                                                           "--set", "env.imports=[users_pkg.exits]"])
    case("mirror that raises", ["validate", str(spec), *user, "--set", "env.mirror=users_pkg:raising_mirror"])
    case("mirror that is not a function", ["validate", str(spec), *user, "--set", "env.mirror=users_pkg:NOT_A_MIRROR"])
    case("plugin module that raises at import", ["validate", str(spec), *user, "--set", "algo.name=theirs",
                                                  "--set", "algo.plugin=users_pkg.raises"])
    case("Minari metadata.json that is a list", ["validate", str(SPECS / "rlpd.yaml"),
                                                 "--set", f"algo.prior_data={minari_list}"])
    case("missing py_modules folder on the Ray backend", ["run", str(spec), "--set", "env.py_modules=[no/such/dir]",
                                                          "--set", "runtime.backend=ray"])
    disk = None if smoke else mounted_small_disk(scratch)
    if disk is not None:
        try:
            for fmt in ("torchscript", "onnx"):
                case(f"export onto a full disk ({fmt})", ["export", str(scratch / "theirs_model"), "--format", fmt,
                                                          "--out", str(disk / f"policy.{fmt}")], watch=disk)
            for fmt in ("parquet", "minari"):
                out = disk / ("d.parquet" if fmt == "parquet" else "minari_root")
                case(f"rollout onto a full disk ({fmt})", ["rollout", str(SPECS / "sac.yaml"), *sets(*SMALL),
                                                           "--scripted", "--episodes", "4", "--format", fmt,
                                                           "--out", str(out)], watch=disk)
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    # 4. validate agrees with run
    for name, override in [
        ("wrong-length mirror with sym_aug", f"env.py_modules=[{ROOT / 'tests/user_envs/myenvs'}]"),
        ("budget.stop_at on a metric that does not exist", "budget.stop_at={metric: eval/distance, below: 0.01}"),
        ("algo.plugin beside a built-in algo.name", "algo.plugin=some.module"),
        ("actor_obs: []", "algo.actor_obs=[]"),
        ("py_modules that is missing", "env.py_modules=[no/such/dir]"),
        ("py_modules of /", "env.py_modules=[/]"),
        ("NaN inside env.kwargs", "env.kwargs={g: .nan}"),
        ("output folder with a NUL byte", 'runtime.output_dir="runs\\0x"'),
        ("seed above 2^63", f"seed={2**63}"),
        ("tracking.flush_every_s=1e10", "tracking.flush_every_s=1e10"),
        ("runtime.stop_grace_s=1e10", "runtime.stop_grace_s=1e10"),
    ]:
        extra = ["--set", "env.mirror=myenvs.point:MIRROR", "--set", "algo.sym_aug=true"] if "mirror" in name else []
        case(name, ["validate", str(spec), "--set", override, *extra])
    case("a grid of 10^6 trials", ["validate", str(grid)])
    case("two suite env ids that map to the same cell", ["validate", str(suite)])
    # 5. the smaller resume cases that need no training
    if not smoke:
        subprocess.run([AA_RAY, "rollout", str(SPECS / "sac.yaml"), *sets(*SMALL), "--scripted", "--episodes", "1",
                        "--out", str(dataset)], cwd=scratch, capture_output=True, timeout=600)
    case("rollout --out onto an existing dataset", ["rollout", str(SPECS / "sac.yaml"), *sets(*SMALL), "--scripted",
                                                    "--episodes", "1", "--out", str(dataset)])
    # /sys takes no new files, also for root (whom file modes do not stop)
    case("an unwritable SQLite store", ["run", str(spec), "--set", "tracking.enabled=true"],
         env={"MLFLOW_TRACKING_URI": "sqlite:////sys/mlflow.db"})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hostile_inputs.json")
    parser.add_argument("--smoke", action="store_true", help=f"only the cases {SMOKE_CASES} (what CI runs)")
    parser.add_argument("--only", nargs="+", default=(), metavar="TEXT",
                        help="only the cases whose name contains one of these texts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aa-ray-hostile-") as scratch:
        outcomes = cases(Path(scratch), args.smoke, tuple(args.only))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([{**asdict(o), "handled": o.handled} for o in outcomes], indent=1))
    print("| case | exit | one message | code ran | secret shown | left behind | handled | seconds |\n"
          "|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        print(f"| {o.case} | {o.exit_code} | {'yes' if o.one_message else 'no'} | {'YES' if o.code_ran else 'no'} | "
              f"{'YES' if o.secret_shown else 'no'} | {', '.join(o.left_behind) or 'nothing'} | "
              f"{'yes' if o.handled else 'NO'} | {o.seconds} |")
    print(f"\n{sum(o.handled for o in outcomes)} of {len(outcomes)} handled")


if __name__ == "__main__":
    main()
