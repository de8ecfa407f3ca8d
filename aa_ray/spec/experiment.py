"""The experiment spec: what a YAML file under `specs/` is validated into."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SerializeAsAny,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_serializer,
    field_validator,
    model_validator,
)

from aa_ray.algos.config import RLPDKnobs
from aa_ray.algos.contract import RunShape
from aa_ray.algos.registry import ALGORITHMS, find_plugin
from aa_ray.metric_names import INFO_KEY, RESERVED_INFO_KEYS, REWARD_TERM
from aa_ray.spec.base import SpecModel
from aa_ray.spec.names import SafeName


def _own_or_plugin_algo(value: Any, validate_own: ValidatorFunctionWrapHandler) -> Any:
    """aa-ray's own algorithms are the discriminated union; any other name is a plugin's (its module
    imported here, after env.py_modules went on the import path), validated by its own config."""
    if isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"] not in ALGORITHMS:
        entry, module = find_plugin(value["name"], value.get("plugin"))
        return entry.config.model_validate({**value, "plugin": module})
    if isinstance(value, dict) and isinstance(value.get("name"), str) and value.get("plugin") is not None:
        # the union would validate the section as aa-ray's own and keep the module name, unused
        raise ValueError(
            f"algo.plugin: names a module of your own algorithm, but algo.name {value['name']} is aa-ray's own, "
            "which never reads it; remove algo.plugin to train aa-ray's, or set algo.name to the name your "
            "plugin's config declares"
        )
    return validate_own(value)


# ---- values that go beyond what pydantic's types bound -------------------------------------------
# The seed reaches numpy's SeedSequence (any size), torch's generators (64 bits at most: eval and
# export seed one with the spec's seed itself, so a larger seed trained and then failed there) and
# 64-bit integer fields; a signed 64-bit integer fits every one of them.
MAX_SEED = 2**63 - 1


def _seed_in_range(value: Any) -> Any:
    # before the strict int check, which says only "a valid integer" of a value past 64 bits
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"must be 0 to 2^63 - 1 ({MAX_SEED}), a signed 64-bit integer: the seed reaches numpy, torch's "
            "generators and 64-bit integer fields, and a larger one does not fit them all (eval and export, which "
            "seed a torch generator with it, would fail after training)"
        )
    return value


Seed = Annotated[NonNegativeInt, BeforeValidator(_seed_in_range)]

# Timers and waits longer than this are a typo, not a plan: threading's timers overflow near 1e10 s
# (TIMEOUT_MAX), which kills the thread that holds them (the metrics' outbox, the stop timer).
MAX_WAIT_S = 3600.0


def _an_hour_at_most(why: str) -> Callable[[float], float]:
    def check(value: float) -> float:
        if value > MAX_WAIT_S:
            raise ValueError(f"must be at most {MAX_WAIT_S:g} seconds (an hour): {why}")
        return value

    return check


def _folder_path(value: str) -> str:
    """A path that becomes a folder: no NUL byte (no file system takes one; Python raises deep inside
    the run), and a leading ~ expanded to the home folder as a shell would, since nothing later does
    and a folder literally named '~' in the current folder is a classic trap."""
    if "\0" in value:
        raise ValueError("contains a NUL byte (\\0), which no file system allows in a path; remove it")
    if value.startswith("~"):
        expanded = os.path.expanduser(value)
        if expanded.startswith("~"):
            raise ValueError(
                f"starts with '~', which names no home folder here ({value.split('/')[0]!r}); write the full path, "
                "or './~...' for a folder that is really named '~'"
            )
        return expanded
    return value


FolderPath = Annotated[str, AfterValidator(_folder_path)]
"""A spec path that becomes a folder (runtime.output_dir, a sweep's, suite's or pipeline's storage):
NUL bytes refused, a leading ~ expanded (os.path.expanduser)."""


def _non_finite_in(value: Any, where: str) -> str | None:
    """Where in a nested value of lists and mappings a float is inf or nan (None if nowhere)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, child in items:
        found = _non_finite_in(child, f"{where}[{key!r}]")
        if found:
            return found
    return None


def _not_a_root_or_home(path: str) -> str:
    """An env.py_modules entry (a `FolderPath`: NUL refused, ~ expanded) that cannot be a package folder
    anywhere: a file system root or the home folder, which Ray would upload whole to every worker."""
    if not path.strip():
        raise ValueError("an empty path names the current folder; name the package folder itself")
    full = os.path.realpath(path)
    if os.path.dirname(full) == full or full == os.path.realpath(os.path.expanduser("~")):
        raise ValueError(
            f"{path!r} is {'a file system root' if os.path.dirname(full) == full else 'your home folder'}: Ray would "
            "zip and upload all of it to every worker; name the package folder itself (the one with __init__.py)"
        )
    return path


OwnAlgoConfig = Union[tuple(entry.config for entry in ALGORITHMS.values())]  # noqa: UP007
# SerializeAsAny: a plugin's config dumps its own fields, not those of the union's members
AlgoConfig = Annotated[SerializeAsAny[OwnAlgoConfig], Field(discriminator="name"), WrapValidator(_own_or_plugin_algo)]


class EnvSpec(SpecModel):
    id: str = Field(
        description="gymnasium id: aa_ray/PusherReach-v0, Pendulum-v1, HalfCheetah-v5, an id a module in env.imports "
        "registers, or gymnasium's 'module:EnvId' form; with env.entry_point it defaults to the entry point"
    )
    entry_point: str | Callable[..., Any] | None = Field(
        None,
        description="an env class or a function returning an env, named by import path ('mypkg.envs:MyRobotEnv'), for "
        "an env that is not registered with gymnasium; the Python API also takes the callable itself",
    )
    imports: list[str] = Field(
        default_factory=list,
        description="modules imported before the env is made, in the driver and in every process that makes it "
        "(e.g. the package that registers your env ids)",
    )
    py_modules: list[Annotated[FolderPath, AfterValidator(_not_a_root_or_home)]] = Field(
        default_factory=list,
        description="local package folders your env needs (each a folder with __init__.py; a leading ~ is the home "
        "folder): they must exist where the spec is run or validated, under 256 MiB, and are put on the import path "
        "here and shipped to "
        "every Ray worker (Ray's runtime_env py_modules), so code that exists only on this machine trains on a cluster",
    )
    mirror: str | None = Field(
        None,
        description="the env's mirror symmetry for algo.sym_aug, by import path ('mypkg.envs:MIRROR': an "
        "aa_ray.envs.symmetry.Mirror, a mapping of obs_perm, obs_sign, act_perm, act_sign, or a function returning "
        "one); an env class may declare it as metadata['mirror'] instead",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for gym.make")
    max_episode_steps: PositiveInt | None = Field(
        None, description="override the registered time limit (null keeps it)"
    )
    batched: Literal["gymnasium", "envpool", "torch", "playground", "unilab"] | None = Field(
        None,
        description="an env that steps many copies in one call (aa_ray.envs.batched): gymnasium = gym.make_vec with "
        "vectorization_mode vector_entry_point (or an entry point returning a gymnasium VectorEnv); envpool = "
        "EnvPool's C++ batched task of this id (pip install aa-ray[envpool]); torch = the entry point called as "
        "entry_point(num_envs=N, device=env.device, **kwargs), an object in the Isaac Lab / mjlab shape (torch "
        "tensors, observation groups, same-step autoreset); playground = MuJoCo Playground's task of this id, "
        "MJX on JAX (pip install aa-ray[playground]); unilab = UniLab's robot task of this id (Go2JoystickFlat, "
        "G1WalkFlat) on its CPU-batched MuJoCo (pip install aa-ray[unilab]). null: E gymnasium copies stepped one "
        "after another",
    )
    device: str = Field(
        "cpu",
        description="env.batched: torch: the device the env's tensors live on (cpu, cuda, cuda:1); with runtime.mode "
        "device, the learner's device too",
    )

    @field_validator("kwargs")
    @classmethod
    def _finite_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        # the spec's floats refuse inf and nan; kwargs hold any value, so they are looked through here
        found = _non_finite_in(kwargs, "kwargs")
        if found:
            raise ValueError(
                f"{found}: a spec's numbers must be finite (YAML's .inf and .nan, and a number too large for a "
                "float, are refused everywhere); give the env a finite value, or leave the keyword out for its default"
            )
        return kwargs

    @model_validator(mode="before")
    @classmethod
    def _id_of_entry_point(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("entry_point") is not None and raw.get("id") is None:
            from aa_ray.envs.source import entry_point_label

            return {**raw, "id": entry_point_label(raw["entry_point"])}
        return raw

    @field_serializer("entry_point", when_used="json")
    def _entry_point_path(self, entry_point: str | Callable[..., Any] | None) -> str | None:
        # a callable is recorded by its import path: a resumed run or `aa-ray eval` imports it from there
        from aa_ray.envs.source import entry_point_label

        return None if entry_point is None else entry_point_label(entry_point)

    @model_validator(mode="after")
    def _importable(self) -> EnvSpec:
        try:
            import mujoco  # noqa: F401  (loads the GL backend MUJOCO_GL names, at import)
        except Exception as err:  # a missing GL library surfaces as ImportError, AttributeError, RuntimeError, ...
            backend = os.environ.get("MUJOCO_GL")
            hint = (
                f"MUJOCO_GL={backend} is set but MuJoCo cannot load that GL backend: install it, pick another "
                "(egl, osmesa), or unset MUJOCO_GL (training renders nothing)"
                if backend else "check the MuJoCo installation"
            )
            raise ValueError(f"cannot import MuJoCo ({type(err).__name__}: {err}); {hint}") from err
        from aa_ray.envs.source import prepare  # MuJoCo loaded: an error from aa_ray.envs is a bug, raised as itself

        prepare(self)  # EnvSourceError is a ValueError: pydantic reports it under env
        return self


class RunnersSpec(SpecModel):
    num_runners: PositiveInt = Field(1, description="R: env-runner actors")
    envs_per_runner: PositiveInt = Field(1, description="E: copies of the env in each runner's vector env")
    cpus_per_runner: PositiveFloat = Field(1.0, description="CPUs reserved per runner actor")
    torch_threads: PositiveInt = Field(1, description="torch threads inside each runner")
    kind: Literal["auto", "vector", "batched"] = Field(
        "auto",
        description="what each runner is (aa_ray.runtime.runners): vector = E gymnasium copies in a sync vector env; "
        "batched = one env.batched env of E copies, stepped in one call; auto = batched when env.batched is set, "
        "else vector",
    )

class LearnersSpec(SpecModel):
    num_learners: PositiveInt = Field(
        1, description="L: learner actors (L > 1 means torch DDP, each on 1/L of the global batch)"
    )
    cpus_per_learner: PositiveFloat = Field(1.0, description="CPUs reserved per learner actor")
    gpus_per_learner: NonNegativeFloat = Field(0.0, description="GPUs per learner; > 0 trains on CUDA")
    torch_threads: PositiveInt = Field(1, description="torch threads inside each learner")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="collective backend for L > 1: auto = nccl with GPUs, gloo on the CPU"
    )
    collective_timeout_s: PositiveFloat = Field(
        300.0, description="how long a learner waits for the others in a collective before failing"
    )
    compile: Literal["off", "on", "auto"] = Field(
        "off",
        description="torch.compile each gradient step (CUDA graphs too on a GPU); auto = on where it measured "
        "faster (CUDA), off on the CPU. A machine where compiling fails trains eagerly (one logged event)",
    )
    matmul_precision: Literal["highest", "high"] = Field(
        "highest", description="float32 matmuls: highest = full fp32; high = TF32 on GPUs that have it"
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1, which PyYAML reads, turns a bare on/off into true/false
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _backend_fits_device(self) -> LearnersSpec:
        if self.backend == "nccl" and self.gpus_per_learner == 0:
            raise ValueError("backend nccl needs GPUs: set learners.gpus_per_learner > 0 or backend gloo")
        return self


_EVAL_METRIC = re.compile(f"eval/({REWARD_TERM})?{INFO_KEY.pattern}")


class StopAtSpec(SpecModel):
    metric: str = Field(
        description="an eval metric: eval/return, eval/length, eval/success (where the env reports "
        "info['is_success']), eval/<key> of a task metric (the env's declared metadata['info_metrics'] and "
        "eval.info_metrics), or eval/reward/<term> of a robot task's reward term (its sum over an episode). A run "
        "whose evaluation cannot produce it is refused at its start"
    )
    below: float | None = Field(None, description="stop once an evaluation's metric is below this")
    above: float | None = Field(None, description="stop once an evaluation's metric is at or above this")

    @field_validator("metric")
    @classmethod
    def _an_eval_metric(cls, metric: str) -> str:
        if not _EVAL_METRIC.fullmatch(metric):
            raise ValueError(
                "must name an eval metric, eval/<name> with a simple identifier as the name (eval/return, "
                "eval/success, eval/distance, ...)"
            )
        return metric

    @model_validator(mode="after")
    def _one_bound(self) -> StopAtSpec:
        if (self.below is None) == (self.above is None):
            raise ValueError(
                f"give exactly one of below, above: the bound {self.metric} has to cross to stop the run (below: "
                "stop once it is below the bound; above: once it is at or above it)"
            )
        return self

    def reached(self, evaluation: dict[str, float]) -> bool:
        value = evaluation[self.metric]
        return value < self.below if self.below is not None else value >= self.above


class BudgetSpec(SpecModel):
    env_steps: PositiveInt = Field(description="stop after this many environment transitions")
    stop_at: StopAtSpec | None = Field(
        None,
        description="stop early once an evaluation crosses a bound: {metric: eval/distance, below: 0.009} or "
        "{metric: eval/return, above: 300} (exactly one of below, above)",
    )
    stop_at_eval_distance: PositiveFloat | None = Field(
        None,
        description="shorthand for stop_at {metric: eval/distance, below: this} (pusher-reach); skipped on an env "
        "without eval/distance. With stop_at_eval_return too, the distance decides where the env has one",
    )
    stop_at_eval_return: float | None = Field(
        None, description="shorthand for stop_at {metric: eval/return, above: this} (at or above)"
    )

    @model_validator(mode="after")
    def _one_way_to_stop(self) -> BudgetSpec:
        if self.stop_at is not None and (self.stop_at_eval_distance, self.stop_at_eval_return) != (None, None):
            raise ValueError(
                "budget.stop_at and the shorthands budget.stop_at_eval_distance / budget.stop_at_eval_return say the "
                "same thing: give budget.stop_at alone"
            )
        return self

    @property
    def stop_rules(self) -> tuple[StopAtSpec, ...]:
        """The early stops, in the order they decide: the first whose metric an evaluation has decides
        (budget.stop_at, or the shorthands: the distance before the return, as they always did)."""
        if self.stop_at is not None:
            return (self.stop_at,)
        rules = []
        if self.stop_at_eval_distance is not None:
            rules.append(StopAtSpec(metric="eval/distance", below=self.stop_at_eval_distance))
        if self.stop_at_eval_return is not None:
            rules.append(StopAtSpec(metric="eval/return", above=self.stop_at_eval_return))
        return tuple(rules)


class EvalSpec(SpecModel):
    every_env_steps: PositiveInt = Field(2000, description="evaluate the deterministic policy this often")
    episodes: PositiveInt = Field(10, description="episodes per evaluation, on separate eval envs")
    info_metrics: list[str] = Field(
        default_factory=list,
        description="numeric keys of the env's step info recorded at each episode's last step: each becomes "
        "eval/<key> (mean over the eval episodes), train/<key> (mean over the recent training episodes) and a "
        "rollout's mean_<key>. Added to the metrics the env declares itself in its metadata['info_metrics'] "
        "(pusher-reach declares distance), so most specs list none; info['is_success'], where the env reports it, "
        "always gives eval/success and train/success. A key the env does not report is left out",
    )
    video: bool = Field(False, description="render the first eval episode (offscreen MuJoCo) to a GIF in MLflow")
    video_max_frames: PositiveInt = Field(200, description="frames of each eval video at most")

    @field_validator("info_metrics")
    @classmethod
    def _info_keys(cls, keys: list[str]) -> list[str]:
        bad = [key for key in keys if not INFO_KEY.fullmatch(key)]
        if bad:
            raise ValueError(
                f"each name must be an info key that is a simple identifier ([A-Za-z_][A-Za-z0-9_]*): it becomes "
                f"eval/<key> and train/<key>; {', '.join(map(repr, bad))} is not"
            )
        taken = [key for key in keys if key in RESERVED_INFO_KEYS]
        if taken:
            raise ValueError(
                f"{', '.join(map(repr, taken))} would clash with the metric of that name aa-ray records itself "
                f"({', '.join(RESERVED_INFO_KEYS)} are taken; info['is_success'] is recorded as eval/success anyway)"
            )
        return list(dict.fromkeys(keys))


class CheckpointSpec(SpecModel):
    every_env_steps: PositiveInt | None = Field(
        None, description="also checkpoint this often (a final checkpoint is always written)"
    )
    save_replay: bool = Field(True, description="store the replay buffer (Parquet) with checkpoints")
    keep_last: PositiveInt | None = Field(
        3,
        description="keep this many of a run's newest step_* checkpoints (final is always kept; null keeps every "
        "one); only the newest keeps its replay file, the one a resume or a recovery reads: the older ones keep the "
        "policy and learner state (eval, export) at a fraction of the size",
    )


def _distinct_backends(backends: list[str]) -> list[str]:
    if not backends:
        raise ValueError("name at least one backend (mlflow, tensorboard, wandb), or set tracking.enabled: false")
    repeated = sorted({name for name in backends if backends.count(name) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} named more than once: list each backend once")
    return backends


class TrackingSpec(SpecModel):
    enabled: bool = Field(True, description="record the run in the tracking backends (tracking.backends)")
    backends: Annotated[list[Literal["mlflow", "tensorboard", "wandb"]], AfterValidator(_distinct_backends)] = Field(
        default_factory=lambda: ["mlflow"],
        description="where a tracked run is recorded, each with the same params and metrics: mlflow (the store at "
        "MLFLOW_TRACKING_URI, the default), tensorboard (event files in the run folder: tensorboard --logdir runs/; "
        "needs pip install 'aa-ray[tensorboard]'), wandb (Weights & Biases, online or with WANDB_MODE=offline; "
        "needs pip install 'aa-ray[wandb]'). Models, the outbox and sweep parent runs are MLflow's",
    )
    wandb_project: SafeName | None = Field(
        None, description="the W&B project of the run (default: tracking.experiment)")
    wandb_entity: SafeName | None = Field(
        None, description="the W&B team or user the project belongs to (default: the logged-in user's default entity)")
    experiment: str = Field("aa-ray", min_length=1, description="MLflow experiment name")
    flush_every_s: Annotated[PositiveFloat, AfterValidator(_an_hour_at_most(
        "metrics wait in the outbox this long before they are sent, so a longer wait loses them to any crash, and "
        "one past threading's limit kills the outbox thread (every metric lost, the run hanging after SIGTERM)"
    ))] = Field(10.0, description="send buffered metrics at most this often (an hour at most)")
    log_model: bool = Field(
        True,
        description="log the final policy as an MLflow Model named policy (PyTorch and pyfunc flavors, a signature "
        "from observations to actions, an input example): mlflow.pyfunc.load_model and mlflow models serve take "
        "runs:/<run id>/policy. A few seconds at the run's end (the first torch.export in a process)",
    )
    log_best_model: bool = Field(
        False,
        description="also log the policy of the run's best evaluation as the MLflow Model best_policy: best by the "
        "first budget.stop_at rule's metric (below: lowest; above: highest), else the highest eval/return",
    )
    register_model: SafeName | None = Field(
        None,
        description="register the logged final policy in MLflow's model registry under this name, a new version "
        "per run (needs log_model)",
    )

    @model_validator(mode="after")
    def _registers_a_logged_model(self) -> TrackingSpec:
        if self.register_model is not None and not self.log_model:
            raise ValueError("register_model registers the logged final policy: set log_model: true as well")
        return self


class RuntimeSpec(SpecModel):
    backend: Literal["ray", "inline"] = Field(
        "ray",
        description="ray: every actor a Ray actor in the run's placement group; inline: the same plain classes "
        "in this process, the sync loop in the same order (the numbers of ray's sync mode for a seed), Ray neither "
        "started nor imported (debugging, notebooks, one-GPU machines). Inline runs one learner in sync mode, "
        "ignores the CPU/GPU reservations and restarts nothing: an exception in any actor ends the run",
    )
    mode: Literal["sync", "async", "device"] = Field(
        "sync",
        description="sync: collection and updates in lockstep (reproducible); async: runners keep collecting "
        "while the learners train; device: each learner process also steps its own env.batched env and keeps a "
        "replay ring on its device, so transitions stay tensors there (one process per GPU, DDP between them)",
    )
    max_policy_lag: PositiveInt = Field(
        2, description="async: a runner's weights are at most this many learner updates old"
    )
    max_runner_restarts: NonNegativeInt = Field(
        3, description="restart a crashed env runner this many times in a run before giving up"
    )
    max_learner_restarts: NonNegativeInt = Field(
        3,
        description="when a learner or the replay actor dies, rebuild the actor graph from the last checkpoint "
        "this many times in a run before giving up",
    )
    max_consecutive_skips: PositiveInt = Field(
        100, description="stop the run after this many gradient steps in a row had a non-finite loss or gradient"
    )
    q_warning_bound: PositiveFloat = Field(
        1e5, description="warn (learner/q_exploding) when the critic's largest value exceeds this"
    )
    replay_cpus: PositiveFloat = Field(0.5, description="CPUs reserved for the replay actor (for each replay shard)")
    replay_shards: PositiveInt = Field(
        1,
        description="off-policy: split the replay buffer over this many replay actors, each with "
        "algo.buffer_size / replay_shards transitions (rounded up) and its own sampling stream. The runners add "
        "in blocks (runner i to shard i x replay_shards / num_runners), and every learner batch draws its rows "
        "from all shards evenly (the RLPD "
        "dataset's rows from shard 0), so the adds and the sampling are spread over processes when one replay "
        "actor is what limits a large fleet (docs/scaling.md). runners.num_runners must be a multiple of it, so "
        "the shards fill alike. 1: one replay actor, the numbers of earlier versions for a seed",
    )
    fleet_actor_from: PositiveInt = Field(
        8,
        description="from this many env runners on, the sync and on-policy loops call the runners through a fleet "
        "actor of its own (aa_ray.runtime.fleet), one call per iteration from the driver, so the driver's CPU per "
        "iteration grows little with the fleet; below it the driver calls them itself, saving the extra hop. "
        "Either way the runners see the same calls in the same order (the same numbers for a seed)",
    )
    placement: Literal["pack", "spread"] = Field(
        "pack",
        description="how the run's placement group lays its bundles over the cluster's nodes. pack: on as few "
        "nodes as possible (Ray's PACK); spread: over as many as possible (Ray's soft SPREAD), so a lost node takes "
        "fewer runners with it and a multi-node cluster's runners use every node. Either way Ray re-places the "
        "bundles of a lost node on the surviving nodes when they have room (the replay actor always shares "
        "learner 0's bundle)",
    )
    trace: bool = Field(
        False,
        description="write trace.json (the driver's phases and Ray's timeline of every actor call, Chrome-trace "
        "format: open it in ui.perfetto.dev) into the run folder and log it to MLflow",
    )
    output_dir: FolderPath = Field(
        "runs", min_length=1,
        description="where run folders and checkpoints go; a leading ~ is the home folder (write ./~ for a folder "
        "named ~)",
    )
    stop_grace_s: Annotated[PositiveFloat, AfterValidator(_an_hour_at_most(
        "it is how long a stopped run may take to end, and schedulers kill a job within seconds to minutes of "
        "SIGTERM; a longer grace only keeps a stuck run alive (and past threading's limit the timer cannot start)"
    ))] = Field(
        25.0,
        description="after SIGTERM or SIGINT (a preemption notice, `ray job stop`, Ctrl-C) the driver ends its "
        "iteration, writes a checkpoint and exits with code 75; if it has not within this many seconds it exits at "
        "once, keeping its last checkpoint. Keep it under the grace period before SIGKILL (Kubernetes 30 s, SLURM's "
        "KillWait 30 s, GCP spot 30 s; `ray job stop` waits RAY_JOB_STOP_WAIT_TIME_S, 3 s unless the cluster sets it); "
        "an hour at most",
    )
    resource_timeout_s: PositiveFloat = Field(
        60.0, description="fail if the cluster cannot place the actors within this time"
    )

    @model_validator(mode="after")
    def _inline_is_sync(self) -> RuntimeSpec:
        if self.backend == "inline" and self.mode == "async":
            raise ValueError(
                "runtime.backend inline runs every actor in one process, one call after another, so it cannot "
                "overlap collection and updates as runtime.mode async does; set runtime.mode: sync to run inline, "
                "or runtime.backend: ray to run async"
            )
        return self


class ExperimentSpec(SpecModel):
    name: SafeName = Field(description="the experiment's name: its run folders, MLflow runs and progress panel show it")
    seed: Seed = Field(
        0, description="the root of every random stream (aa_ray.seeding): envs, exploration, replay, network init; "
        "0 to 2^63 - 1"
    )
    env: EnvSpec
    algo: AlgoConfig
    budget: BudgetSpec
    runners: RunnersSpec = Field(default_factory=RunnersSpec)
    learners: LearnersSpec = Field(default_factory=LearnersSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentSpec:
        if self.runtime.backend == "inline" and self.learners.num_learners > 1:
            raise ValueError(
                f"runtime.backend inline runs one learner in this process, but learners.num_learners is "
                f"{self.learners.num_learners}: several learners train as separate processes in one torch process "
                "group; set learners.num_learners: 1 to run inline, or runtime.backend: ray for several learners"
            )
        from aa_ray.envs.symmetry import MIRRORS, find_mirror  # after _importable: aa_ray.envs loads MuJoCo

        for field, keys in (("actor_obs", self.algo.actor_obs), ("critic_obs", self.algo.critic_obs)):
            if keys == []:
                reads = "the deployed policy" if field == "actor_obs" else "the critic"
                raise ValueError(
                    f"algo.{field}: [] gives {reads} no observation at all; list the Dict observation's keys it "
                    "reads, or leave it out (null: every key)"
                )
        if self.prior_data is not None and "\0" in self.prior_data:
            raise ValueError("algo.prior_data: contains a NUL byte (\\0), which no file system allows in a path")
        sym_aug = self.algo.sym_aug
        # a mirror the spec names is checked (an involution, ...) even while sym_aug is off
        mirror = find_mirror(self.env) if sym_aug or self.env.mirror is not None else None
        if sym_aug and mirror is None:
            raise ValueError(
                f"algo.sym_aug needs mirror transforms for env {self.env.id!r}, and it has none (aa-ray's own: "
                f"{', '.join(MIRRORS)}); name yours by import path in env.mirror (or declare it in the env class's "
                "metadata['mirror']), or set algo.sym_aug: false"
            )
        self._check_batched()
        self._check_replay_shards()
        self.algo.check_run(RunShape(
            self.budget.env_steps, self.learners.num_learners, self.transitions_per_fleet_step, self.runtime.mode
        ))
        return self

    @property
    def runner_kind(self) -> str:
        """`runners.kind`, with auto decided by whether the env is batched."""
        if self.runners.kind != "auto":
            return self.runners.kind
        return "batched" if self.env.batched is not None else "vector"

    def _check_batched(self) -> None:
        """What batched envs and the device mode need of the rest of the spec."""
        if self.runners.kind == "batched" and self.env.batched is None:
            raise ValueError(
                "runners.kind batched steps an env that runs many copies in one call, and env.batched is not set; "
                "name the env's source in env.batched (gymnasium, envpool, torch), or set runners.kind: vector"
            )
        if self.runners.kind == "vector" and self.env.batched is not None:
            raise ValueError(
                f"runners.kind vector makes E gymnasium copies of the env, but env.batched is {self.env.batched!r}: "
                "a batched env steps its copies itself; set runners.kind: batched (or auto), or remove env.batched"
            )
        if self.runtime.mode != "device":
            return
        if self.env.batched is None:
            raise ValueError(
                "runtime.mode device keeps the env in the learner's process and needs an env that steps its copies in "
                "one call: set env.batched (torch for an env whose tensors live on a device)"
            )
        if self.algo.family != "off_policy":
            raise ValueError(
                f"runtime.mode device keeps a replay ring beside the learner; {self.algo.name} learns on-policy: "
                "use runtime.mode sync for it"
            )
        if self.runners.num_runners != self.learners.num_learners:
            raise ValueError(
                f"runtime.mode device runs one env per learner process, so runners.num_runners "
                f"({self.runners.num_runners}) must equal learners.num_learners ({self.learners.num_learners}); "
                "runners.envs_per_runner is each process's number of env copies"
            )
        unsupported = [field for field, used in (("sym_aug", self.algo.sym_aug),
                                                 ("prior_data", self.prior_data is not None)) if used]
        if unsupported:
            raise ValueError(
                f"algo.{unsupported[0]} is not supported in runtime.mode device yet; use runtime.mode sync for it"
            )

    def _check_replay_shards(self) -> None:
        shards = self.runtime.replay_shards
        if shards == 1:
            return
        if not self.algo.replay_actor or self.runtime.mode == "device":
            where = (f"{self.algo.name} learns on-policy, from fresh rollouts" if not self.algo.replay_actor
                     else "runtime.mode device keeps a replay ring in each learner instead")
            raise ValueError(
                f"runtime.replay_shards is {shards}, but this run has no replay actor to split ({where}); "
                "set runtime.replay_shards: 1"
            )
        if self.runners.num_runners % shards:
            raise ValueError(
                f"runtime.replay_shards ({shards}) must divide runners.num_runners ({self.runners.num_runners}): each "
                "shard takes the chunks of the same number of runners, so that the shards fill alike and a batch "
                "drawn evenly from them draws every transition about as often; change either"
            )

    @property
    def prior_data(self) -> str | None:
        """RLPD's dataset path, or None (on-policy algorithms have none)."""
        return self.algo.prior_data if isinstance(self.algo, RLPDKnobs) else None

    @property
    def transitions_per_fleet_step(self) -> int:
        return self.runners.num_runners * self.runners.envs_per_runner

    def bundles(self, learning: bool = True) -> list[dict[str, float]]:
        """Placement-group bundles: the learners, then the runners; the runners alone when the run does
        not learn (a rollout). The replay actor (if the algorithm's family has one) shares learner 0's
        bundle, and so its node: every learner iteration's sample (45 MB at batch 8192) then reaches
        the learner through shared memory instead of over the network. With `runtime.replay_shards`,
        shard 0 does, and each other shard shares the bundle of the first runner that adds to it. In
        `runtime.mode: device` each learner's process steps its own envs and keeps its own replay ring:
        the learners' bundles alone."""
        runners = [{"CPU": self.runners.cpus_per_runner} for _ in range(self.runners.num_runners)]
        if not learning:
            return runners
        learners = [{"CPU": self.learners.cpus_per_learner} for _ in range(self.learners.num_learners)]
        for learner in learners:
            if self.learners.gpus_per_learner > 0:
                learner["GPU"] = self.learners.gpus_per_learner
        if self.runtime.mode == "device":
            return learners
        if self.algo.replay_actor:
            for shard in range(self.runtime.replay_shards):
                (learners[0] if shard == 0 else runners[self.first_runner_of_replay_shard(shard)])["CPU"] += \
                    self.runtime.replay_cpus
        return learners + runners

    def replay_shard_of(self, runner: int) -> int:
        """The replay shard runner `runner` adds to: the runners in blocks of num_runners / replay_shards."""
        return runner * self.runtime.replay_shards // self.runners.num_runners

    def first_runner_of_replay_shard(self, shard: int) -> int:
        """Replay shard `shard` > 0 shares this runner's bundle (and so a node with its block of runners
        where the placement packs them); shard 0 shares learner 0's, as the one replay actor does."""
        return shard * self.runners.num_runners // self.runtime.replay_shards
