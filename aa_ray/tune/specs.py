"""Sweep, suite and pipeline spec files: pydantic models, and loaders that check everything that can be
checked before Ray starts (each search key and stage spec is validated as an experiment spec,
stage references must name earlier outputs, and the stages must not form a cycle)."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError, model_validator

from aa_ray import metric_names as m
from aa_ray.errors import SpecError, echo
from aa_ray.spec.base import SpecModel
from aa_ray.spec.experiment import ExperimentSpec, FolderPath, Seed
from aa_ray.spec.loader import format_validation_error, read_yaml, set_values, validate_spec
from aa_ray.spec.names import MAX_NAME_LENGTH, SafeName

STORAGE_HELP = (
    "where Tune keeps trial state and checkpoints: a path every node mounts or a URI (s3://, gs://); "
    "default <runtime.output_dir>/tune, which only a single-node cluster can use; a leading ~ is the home folder"
)
# What trials report and a sweep may optimize, besides the env's task metrics (eval/<key> and train/<key>,
# aa_ray/envs/info_metrics.py); eval/success and train/success exist where the env reports is_success.
SWEEP_METRICS = (m.EVAL_RETURN, m.EVAL_SUCCESS, m.EVAL_LENGTH, m.TRAIN_EPISODE_RETURN, m.TRAIN_SUCCESS)
# Trials a sweep may expand to: each is a run with its own checkpoints and MLflow run, and Tune keeps
# every one in memory; checking the grid of a million took minutes before it was accepted.
MAX_TRIALS = 10_000
MAX_OPTUNA_SEED = 2**32 - 1  # the base's seed seeds Optuna's sampler (tune/sweep.py), a numpy RandomState


# ---- sweeps ------------------------------------------------------------------------------------
class Domain(SpecModel):
    """One search dimension: exactly one of grid, choice, uniform, loguniform."""

    grid: list[Any] | None = Field(None, min_length=1, description="every value, crossed with other grids")
    choice: list[Any] | None = Field(None, min_length=1, description="one value drawn per sample")
    uniform: tuple[float, float] | None = Field(None, description="[low, high], drawn uniformly")
    loguniform: tuple[PositiveFloat, PositiveFloat] | None = Field(None, description="[low, high], log-uniform")

    @model_validator(mode="after")
    def _exactly_one(self) -> Domain:
        given = [name for name in ("grid", "choice", "uniform", "loguniform") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of grid, choice, uniform, loguniform (got {given or 'none'})")
        bounds = self.uniform or self.loguniform
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"{given[0]} needs low < high, got {list(bounds)}")
        return self

    def probe_values(self) -> list[Any]:
        """Values that stand for the whole domain when checking it against the spec."""
        return list(self.grid or self.choice or self.uniform or self.loguniform)

    def to_tune(self) -> Any:
        from ray import tune

        if self.grid is not None:
            return tune.grid_search(self.grid)
        if self.choice is not None:
            return tune.choice(self.choice)
        if self.uniform is not None:
            return tune.uniform(*self.uniform)
        return tune.loguniform(*self.loguniform)


class AshaSpec(SpecModel):
    grace_period: PositiveInt = Field(description="env steps every trial runs before it can be stopped")
    reduction_factor: float = Field(2.0, gt=1, description="keep 1/reduction_factor of trials at each rung")


class SweepSpec(SpecModel):
    name: SafeName = Field(description="names the MLflow parent run, the Tune experiment and the sweep's folder")
    base: str = Field(description="the experiment spec every trial starts from (relative to this file)")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides of the base for all trials")
    search_space: dict[str, Domain] = Field(min_length=1, description="dotted spec key -> domain")
    metric: str = Field(
        m.EVAL_RETURN,
        description=f"what ranks the trials (last report): {', '.join(SWEEP_METRICS)}, or eval/<key> or "
        "train/<key> of a task metric of the base's env (its declared metadata['info_metrics'] and "
        "eval.info_metrics)",
    )
    mode: Literal["max", "min"] = "max"
    num_samples: PositiveInt = Field(1, description="samples of the space (each repeats the whole grid)")
    max_concurrent_trials: PositiveInt = Field(1, description="trials running at once")
    max_failures: NonNegativeInt = Field(1, description="retry a failed trial from its last checkpoint this often")
    scheduler: Literal["fifo", "asha"] = Field("fifo", description="asha stops weak trials early")
    asha: AshaSpec | None = None
    searcher: Literal["random", "optuna"] = Field("random", description="random: Tune's grid/random variants")
    storage: FolderPath | None = Field(None, description=STORAGE_HELP)

    @model_validator(mode="after")
    def _combinations(self) -> SweepSpec:
        if self.scheduler == "asha" and self.asha is None:
            raise ValueError("scheduler asha needs an asha section (grace_period in env steps)")
        if self.searcher == "optuna":
            grids = [key for key, domain in self.search_space.items() if domain.grid is not None]
            if grids:
                raise ValueError(f"searcher optuna cannot search grids ({', '.join(grids)}); use choice")
        trials = self.num_samples * math.prod(len(d.grid) for d in self.search_space.values() if d.grid is not None)
        if trials > MAX_TRIALS:
            sizes = " x ".join(f"{len(d.grid)} ({key})" for key, d in self.search_space.items() if d.grid is not None)
            raise ValueError(
                f"search_space: the grids cross to {trials:,} trials (num_samples {self.num_samples} x {sizes}), more "
                f"than the {MAX_TRIALS:,} a sweep may run (each trial is a run of its own); shorten the grids, or "
                "draw values with choice, uniform or loguniform and set num_samples"
            )
        return self


class Sweep:
    """A validated sweep: its spec, the base experiment (raw dict) and the base's folder."""

    def __init__(self, spec: SweepSpec, base_raw: dict[str, Any], path: Path):
        self.spec, self.base_raw, self.path = spec, base_raw, path

    def trial_spec(self, params: dict[str, Any], here: bool = False) -> ExperimentSpec:
        raw = set_values(self.base_raw, params, source=f"sweep {self.path} search_space")
        return validate_spec(raw, source=f"{self.path} trial {params}", here=here)


def _model(model: type[SpecModel], raw: dict[str, Any], source: Path) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, str(source))) from None


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file: every search key and value (grid and choice values, range
    bounds) must make a valid experiment spec. Raises SpecError naming the key."""
    path = Path(path)
    spec = _model(SweepSpec, read_yaml(path), path)
    base_raw = set_values(read_yaml(path.parent / spec.base), spec.set, source=f"{path} set")
    sweep = Sweep(spec, base_raw, path)
    base = validate_spec(base_raw, source=f"{path.parent / spec.base} (the base of {path})", here=True)
    _check_metric(spec.metric, base, path)
    if spec.searcher == "optuna" and base.seed > MAX_OPTUNA_SEED:
        raise SpecError(
            f"{path}: searcher optuna seeds its sampler with the base's seed, {base.seed}, and Optuna takes seeds of "
            "0 to 2^32 - 1 only (numpy's RandomState), so the sweep would fail as it starts; set seed (in the base "
            "or the sweep's set:) to at most 4294967295."
        )
    for key, domain in spec.search_space.items():
        for value in domain.probe_values():
            try:
                sweep.trial_spec({key: value}, here=True)
            except SpecError as err:
                raise SpecError(
                    f"{path}: search_space.{key} = {echo(value)} does not make a valid spec.\n{err}"
                ) from None
    grids = {key: domain.grid for key, domain in spec.search_space.items() if domain.grid is not None}
    for combination in itertools.product(*grids.values()):  # grids can clash with each other
        sweep.trial_spec(dict(zip(grids, combination, strict=True)))
    return sweep


def _check_metric(metric: str, base: ExperimentSpec, path: Path) -> None:
    """SpecError unless the trials report `metric`: one of SWEEP_METRICS or a task metric of the
    base's env (made once here to read the ones it declares)."""
    if metric in SWEEP_METRICS:
        return
    from aa_ray.envs.info_metrics import metric_name
    from aa_ray.envs.make import task_metric_keys

    names = [metric_name(key) for key in task_metric_keys(base)]
    reported = [*SWEEP_METRICS, *(prefix + name for name in names for prefix in (m.EVAL_PREFIX, m.TRAIN_PREFIX))]
    if metric not in reported:
        raise SpecError(
            f"{path}: metric {metric!r} is not a metric the trials report; name one of "
            f"{', '.join(dict.fromkeys(reported))} (a task metric of {base.env.id} comes from the env's "
            "metadata['info_metrics'] or the base's eval.info_metrics)."
        )


# ---- suites ------------------------------------------------------------------------------------
_ENV_ID_CHARACTERS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*")  # gymnasium's: namespace/Name-v0, module:Name


def _env_id_for_folders(env_id: str) -> str:
    if len(env_id) > MAX_NAME_LENGTH or not _ENV_ID_CHARACTERS.fullmatch(env_id):
        raise ValueError(
            f"an env id of a suite becomes part of its cells' folder names: 1 to {MAX_NAME_LENGTH} characters, ASCII "
            "letters, digits, '_', '.', ':', '/' and '-', not starting with '.', '-', ':' or '/'"
        )
    return env_id


SuiteEnvId = Annotated[str, AfterValidator(_env_id_for_folders)]


class SuiteEntry(SpecModel):
    spec: str = Field(description="experiment spec (relative to the suite file)")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides for this label's runs")


class SuiteSpec(SpecModel):
    """Algorithm specs x env ids x seeds, one budget and one evaluation protocol: a benchmark."""

    name: SafeName = Field(description="names the MLflow parent run and the suite's folder")
    specs: dict[SafeName, str | SuiteEntry] = Field(
        min_length=1, description="label (part of each cell's folder name) -> experiment spec (relative to this "
        "file), or {spec, set}"
    )
    envs: dict[SuiteEnvId, dict[str, Any]] = Field(
        min_length=1, description="env id -> dotted overrides for that env's runs (e.g. budget.env_steps)"
    )
    seeds: list[Seed] = Field(min_length=1, description="every spec and env runs once per seed")
    env_steps: PositiveInt = Field(description="each run's budget, unless its env sets budget.env_steps")
    eval: dict[str, Any] = Field(
        default_factory=dict, description="the evaluation protocol of every run: eval.* keys (every_env_steps, ...)"
    )
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides for every run")
    references: str | None = Field(
        None, description="published returns (YAML, relative to this file) that reports draw as markers"
    )
    max_concurrent_trials: PositiveInt = Field(1, description="runs at once")
    max_failures: NonNegativeInt = Field(2, description="retry a failed run from its last checkpoint this often")
    storage: FolderPath | None = Field(None, description=STORAGE_HELP)

    @model_validator(mode="after")
    def _distinct_seeds(self) -> SuiteSpec:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds repeat a value ({self.seeds}); each seed runs once")
        return self


class Suite:
    """A validated suite: every cell (spec label, env id, seed) with its raw experiment spec."""

    def __init__(self, spec: SuiteSpec, path: Path, cells: dict[str, dict[str, Any]]):
        self.spec, self.path = spec, path
        self.cells = cells  # cell name -> {"label", "env", "seed", "raw"}

    def references_path(self) -> Path | None:
        return None if self.spec.references is None else (self.path.parent / self.spec.references)


def cell_name(label: str, env_id: str, seed: int) -> str:
    return f"{label}-{env_id.replace('/', '_')}-s{seed}"


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file: every cell's spec is validated before Ray starts, so a typo in
    one env's overrides fails now, naming the cell, rather than hours into the suite."""
    path = Path(path)
    spec = _model(SuiteSpec, read_yaml(path), path)
    protocol = {f"eval.{key}": value for key, value in spec.eval.items()}
    cells: dict[str, dict[str, Any]] = {}
    folders: dict[str, str] = {}  # a cell's folder name, casefolded (macOS and Windows) -> the cell
    for label, entry in spec.specs.items():
        entry = entry if isinstance(entry, SuiteEntry) else SuiteEntry(spec=entry)
        spec_file = entry.spec
        base = read_yaml(path.parent / spec_file)
        for env_id, env_overrides in spec.envs.items():
            for seed in spec.seeds:
                name = cell_name(label, env_id, seed)
                if name.casefold() in folders:  # one would silently overwrite the other's runs and results
                    other = cells[folders[name.casefold()]]
                    raise SpecError(
                        f"{path}: envs: spec {label!r} with env {env_id!r} and spec {other['label']!r} with env "
                        f"{other['env']!r} make the same cell folder {name!r} ('/' becomes '_', and case is not "
                        "told apart on every file system), so one would be lost; give each env id once, and labels "
                        "that do not run into env ids."
                    )
                folders[name.casefold()] = name
                values = {**spec.set, **entry.set, **protocol, "env.id": env_id, "seed": seed,
                          "budget.env_steps": spec.env_steps, **env_overrides}
                raw = set_values(base, values, source=f"{path} ({name})")
                # the seed changes nothing check_here looks at: the first seed's cell stands for the others
                validate_spec(raw, source=f"{path} cell {name} ({spec_file} with env {env_id}, seed {seed})",
                              here=seed == spec.seeds[0])
                cells[name] = {"label": label, "env": env_id, "seed": seed, "raw": raw}
    references = spec.references and path.parent / spec.references
    if references and not references.is_file():
        raise SpecError(f"{path}: references: {spec.references} does not exist (looked for {references}).")
    return Suite(spec, path, cells)


# ---- pipelines ---------------------------------------------------------------------------------
OUTPUTS = {"train": "checkpoint", "rollout": "dataset"}


class TrainStage(SpecModel):
    kind: Literal["train"]
    spec: str = Field(description="experiment spec (relative to the pipeline file)")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides of that spec")
    inputs: dict[str, str] = Field(
        default_factory=dict, description="dotted spec key -> STAGE.OUTPUT, e.g. algo.prior_data: data.dataset"
    )

    def references(self) -> dict[str, str]:
        return dict(self.inputs)


class RolloutStage(SpecModel):
    kind: Literal["rollout"]
    policy: str | None = Field(None, description="STAGE.checkpoint whose policy acts (or scripted: true)")
    scripted: bool = Field(False, description="act with the env's scripted controller instead")
    spec: str | None = Field(None, description="spec for the env and runners (default: the policy stage's)")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides of that spec")
    episodes: PositiveInt
    deterministic: bool = Field(False, description="the policy's mean action instead of a sample")
    format: Literal["parquet", "minari"] = Field(
        "parquet", description="the dataset's format: Parquet (RLlib's columns) or a Minari dataset"
    )
    dataset_id: str | None = Field(
        None, description="with format: minari, the dataset's Minari id (default <pipeline>/<stage>-v0)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> RolloutStage:
        if (self.policy is None) == (not self.scripted):
            raise ValueError("a rollout stage needs exactly one of policy: STAGE.checkpoint or scripted: true")
        if self.scripted and self.spec is None:
            raise ValueError("a scripted rollout stage needs a spec (which env to run)")
        if self.dataset_id is not None:
            from aa_ray.data.minari_format import valid_dataset_id

            if self.format != "minari":
                raise ValueError("dataset_id names a Minari dataset: set format: minari, or leave dataset_id out")
            if not valid_dataset_id(self.dataset_id):
                raise ValueError(f"dataset_id {self.dataset_id!r} is not a Minari id ((namespace/)name-v<version>)")
        return self

    def references(self) -> dict[str, str]:
        return {"policy": self.policy} if self.policy else {}


Stage = Annotated[Union[TrainStage, RolloutStage], Field(discriminator="kind")]  # noqa: UP007


class PipelineSpec(SpecModel):
    name: SafeName = Field(description="names the MLflow parent run and the stage cache folder")
    stages: dict[SafeName, Stage] = Field(
        min_length=1, description="stage name (part of its folder's name) -> stage; run in dependency order"
    )
    max_failures: NonNegativeInt = Field(0, description="retry a failed stage from its last checkpoint this often")
    storage: FolderPath | None = Field(None, description=STORAGE_HELP)


class Pipeline:
    """A validated pipeline: its spec, the stage order, and each stage's raw experiment spec."""

    def __init__(self, spec: PipelineSpec, path: Path, order: list[str], raws: dict[str, dict[str, Any]],
                 checked: dict[str, ExperimentSpec]):
        self.spec, self.path, self.order, self.raws = spec, path, order, raws
        self.checked = checked  # each stage's spec with placeholders for its inputs (its size is known)


def parse_reference(reference: str) -> tuple[str, str]:
    stage, _, output = reference.partition(".")
    return stage, output


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and check a pipeline file: references, order (no cycles) and every stage's spec."""
    path = Path(path)
    spec = _model(PipelineSpec, read_yaml(path), path)
    for name, stage in spec.stages.items():
        for where, reference in stage.references().items():
            target, output = parse_reference(reference)
            if target not in spec.stages:
                known = ", ".join(spec.stages)
                raise SpecError(
                    f"{path}: stage {name!r} {where} refers to stage {target!r}, which the pipeline does not "
                    f"have (stages: {known})."
                )
            wanted = OUTPUTS[spec.stages[target].kind]
            if output != wanted:
                raise SpecError(
                    f"{path}: stage {name!r} {where} refers to {reference!r}; a {spec.stages[target].kind} stage's "
                    f"output is {target}.{wanted}."
                )
    order = _dependency_order(spec, path)
    raws: dict[str, dict[str, Any]] = {}
    checked: dict[str, ExperimentSpec] = {}
    for name in order:
        stage = spec.stages[name]
        if stage.spec is not None:
            raw = set_values(read_yaml(path.parent / stage.spec), stage.set, source=f"{path} stage {name} set")
        else:  # a rollout of a trained policy runs with that stage's spec
            raw = set_values(raws[parse_reference(stage.policy)[0]], stage.set, source=f"{path} stage {name} set")
        if isinstance(stage, TrainStage):  # placeholders now; the real paths once the inputs exist
            placeholders = set_values(raw, {key: f"<{reference}>" for key, reference in stage.inputs.items()})
            checked[name] = validate_spec(
                placeholders, source=f"{path} stage {name!r} ({stage.spec}, set, inputs)", here=True
            )
        else:
            checked[name] = validate_spec(raw, source=f"{path} stage {name!r}", here=True)
            if stage.scripted:
                _check_scripted(checked[name], name, path)
        raws[name] = raw
    return Pipeline(spec, path, order, raws, checked)


def _check_scripted(spec: ExperimentSpec, stage: str, path: Path) -> None:
    """SpecError unless the stage's env declares a scripted controller (what the rollout looks up when
    it starts; the env made once here to read its metadata)."""
    from aa_ray.rollout.job import RolloutError, check_scripted

    try:
        check_scripted(spec, instead="roll out a trained policy instead (policy: STAGE.checkpoint), or use an env "
                                     "with a controller")
    except RolloutError as err:
        raise SpecError(f"{path}: stage {stage!r} scripted: true acts with the env's scripted controller, and {err}") \
            from None


def _dependency_order(spec: PipelineSpec, path: Path) -> list[str]:
    """Stages in an order where each comes after the stages it refers to (file order otherwise)."""
    needs = {
        name: [parse_reference(ref)[0] for ref in stage.references().values()] for name, stage in spec.stages.items()
    }
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join([*trail[trail.index(name):], name])
            raise SpecError(f"{path}: the stages refer to each other in a cycle ({cycle}); a stage can only use "
                            "outputs of stages that can run before it.")
        state[name] = "visiting"
        for dependency in needs[name]:
            visit(dependency, [*trail, name])
        state[name] = "done"
        order.append(name)

    for name in spec.stages:
        visit(name, [])
    return order


# ---- which kind of file ------------------------------------------------------------------------
FILE_MODELS: dict[str, type[SpecModel]] = {
    "experiment spec": ExperimentSpec, "sweep": SweepSpec, "suite": SuiteSpec, "pipeline": PipelineSpec,
}


def _keys_only_in(kind: str) -> set[str]:
    others = set().union(*(set(model.model_fields) for other, model in FILE_MODELS.items() if other != kind))
    return set(FILE_MODELS[kind].model_fields) - others


def file_kind(raw: dict[str, Any], path: Path) -> str:
    """Which of the README's file kinds `raw` (a file's top-level mapping) is: the kind with the most
    of the top-level keys only it has (algo and env: an experiment spec; search_space: a sweep; specs,
    envs and seeds: a suite; stages: a pipeline), so a file with one of them misspelt or missing is
    still recognized and validated as what it is. SpecError if no kind, or two, fit."""
    counts = {kind: len(raw.keys() & _keys_only_in(kind)) for kind in FILE_MODELS}
    best = max(counts.values())
    kinds = [kind for kind, count in counts.items() if count == best]
    if best == 0 or len(kinds) > 1:
        hints = "; ".join(f"a {kind} has {', '.join(sorted(_keys_only_in(kind)))}" for kind in FILE_MODELS)
        found = ", ".join(echo(key) for key in list(raw)[:10])
        raise SpecError(f"{path}: cannot tell which kind of file this is (top-level keys: {found}); {hints}.")
    return kinds[0]
