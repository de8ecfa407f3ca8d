"""aa-ray from Python, for notebooks and scripts. The `aa-ray` command is a thin layer over this
module: `aa-ray run` is `Experiment(...).fit()`, `aa-ray eval` is `load_policy(...).evaluate()`,
`aa-ray export` is `load_policy(...).export()`.

    from aa_ray.api import Experiment, load_policy

    experiment = Experiment("specs/sac.yaml", {"budget.env_steps": 3000})
    result = experiment.fit(callbacks=[print])    # each evaluation and checkpoint, as a `Report`
    policy = load_policy(result.checkpoint)
    actions = policy.predict(observations)        # numpy in, env actions out (a batch or one)
    policy.evaluate(episodes=10)                  # {"eval/return": ..., "eval/success": ..., ...}

`fit` trains on an embedded local Ray instance, or joins the cluster at `RAY_ADDRESS`, exactly as
the command does. A callback that returns True stops the run after that report (with a final
checkpoint). Progress is plain log lines unless stderr is a terminal, so a notebook shows lines,
not a redrawn panel (`progress="live"` or `"plain"` chooses).

Errors are the command's: `SpecError` for a bad spec or override, `TrackingError` for an MLflow store
that cannot be used, `ExportError` for a file that cannot be written where asked (all three
`aa_ray.errors.UserError`), `CheckpointError` for a missing, corrupt or foreign checkpoint or one
whose policy weights are not finite, `DatasetError` for a prior dataset that does not fit the env
or holds NaN, infinite or out-of-range values, `TrainingError` / `ResourceError` when a run fails,
each with a message that names the field or file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from aa_ray import metric_names as m
from aa_ray.errors import SpecError, UserError, write_failure
from aa_ray.spec.experiment import ExperimentSpec
from aa_ray.spec.loader import apply_overrides, read_yaml, set_values, validate_spec

EXPORT_FORMATS = ("torchscript", "onnx")


class ExportError(UserError):
    """A policy file (or an evaluation's video) cannot be written where asked; the message names the
    path and why. Nothing was written."""


@dataclass(frozen=True)
class Report:
    """What a callback sees after an evaluation or a checkpoint (`final` once, at the end)."""

    env_steps: int
    metrics: dict[str, float]
    checkpoint: Path | None  # the checkpoint written at this point, if one was
    final: bool = False


Callback = Callable[[Report], Any]  # returns True to stop the run


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    checkpoint: Path  # the final checkpoint
    mlflow_run_id: str | None
    mlflow_url: str | None  # the run's page in the MLflow UI (for a local store: once `mlflow ui` serves it)
    env_steps: int
    stop_reason: str  # "budget", "target reached" or "stopped by a callback"
    metrics: dict[str, float]  # the last evaluation's
    evals: list[dict[str, float]] = field(repr=False)
    # the run's id in each backend of tracking.backends: "mlflow", "tensorboard" (its event folder), "wandb"
    tracking_runs: dict[str, str] = field(default_factory=dict)


EnvCreator = Callable[..., Any]  # returns a gymnasium Env; called with env.kwargs


class Experiment:
    """A validated spec, from a YAML file or a dict, with overrides by dotted key. `env_creator`: a
    function (or env class) that makes the env, called with `env.kwargs`, in place of `env.id` (it
    becomes `env.entry_point`; the spec may leave `env` out). On Ray it reaches the workers pickled
    (by value when defined in a notebook or the script itself; by import otherwise, so its module
    must be importable there too, e.g. through `env.py_modules`). An `ExperimentSpec` with no
    overrides and no creator is taken as it is: it was validated (`load_spec` also ran the checks
    only this machine can make, `spec.local_checks`)."""

    def __init__(
        self,
        spec: str | Path | Mapping[str, Any] | ExperimentSpec,
        overrides: Mapping[str, Any] | Iterable[str] = (),
        *,
        env_creator: EnvCreator | None = None,
    ):
        self.trainer: Any = None  # the last fit's driver: its last_checkpoint survives a failed run
        if isinstance(spec, ExperimentSpec) and not overrides and env_creator is None:
            self.spec: ExperimentSpec = spec  # validated already (`aa-ray run`'s, through load_spec's local checks)
            return
        if isinstance(spec, ExperimentSpec | Mapping):  # Python values: JSON would turn a NaN into null
            raw, source = (spec.model_dump() if isinstance(spec, ExperimentSpec) else dict(spec)), "the spec"
        else:
            raw, source = read_yaml(spec), str(spec)
        if isinstance(overrides, Mapping):  # values as Python objects
            raw = set_values(raw, overrides, source="override")
            shown = [f"{key}={value}" for key, value in overrides.items()]
        else:  # "dotted.key=value" strings, as --set takes them
            shown = list(overrides)
            raw = apply_overrides(raw, shown)
        if env_creator is not None:
            raw = _with_creator(raw, env_creator)
        # here=True: the user's spec, on the machine the run starts from (its folders, stop metric, mirror)
        self.spec = validate_spec(raw, source + (f" with {' '.join(shown)}" if shown else ""), here=True)

    def fit(
        self,
        callbacks: Iterable[Callback] = (),
        *,
        resume: str | Path | None = None,
        track: bool | None = None,
        progress: Literal["auto", "live", "plain"] = "auto",
        resume_without_replay: bool = False,
    ) -> RunResult:
        """Train until the budget, a `budget.stop_at_*` target or a callback stops the run.
        `resume`: a checkpoint folder to continue from; `track`: False keeps it out of MLflow;
        `resume_without_replay`: resume with an empty buffer, not the checkpoint's replay file."""
        from aa_ray.runtime.checkpoint import load_checkpoint
        from aa_ray.runtime.cluster import job_tracking_problem
        from aa_ray.runtime.trainer import Trainer

        tracked = self.spec.tracking.enabled if track is None else track
        problem = job_tracking_problem(tracked and "mlflow" in self.spec.tracking.backends)
        if problem:
            raise SpecError(problem)
        checkpoint = load_checkpoint(resume) if resume is not None else None  # checked against the spec in run()
        callbacks = list(callbacks)
        live = {"auto": None, "live": True, "plain": False}[progress]
        self.trainer = Trainer(self.spec, resume=checkpoint, track=track, live=live,
                               reporter=_reporter(callbacks) if callbacks else None,
                               resume_without_replay=resume_without_replay)
        outcome = self.trainer.run()
        return RunResult(
            run_dir=outcome.run_dir, checkpoint=outcome.checkpoint, mlflow_run_id=outcome.mlflow_run_id,
            mlflow_url=outcome.mlflow_url, env_steps=outcome.env_steps, stop_reason=outcome.stop_reason,
            metrics=dict(outcome.evals[-1]) if outcome.evals else {}, evals=outcome.evals,
            tracking_runs=outcome.tracking_runs,
        )

    learn = fit  # SB3's name for it


def _with_creator(raw: Mapping[str, Any], env_creator: EnvCreator) -> dict[str, Any]:
    """The raw spec with the creator as its env's entry point (and the creator's import path as the
    env's id)."""
    if not callable(env_creator):
        raise SpecError(f"env_creator must be a function or an env class, got {type(env_creator).__name__}.")
    env = {key: value for key, value in (raw.get("env") or {}).items() if key != "id"}  # the id: its label
    return {**raw, "env": {**env, "entry_point": env_creator}}


def _reporter(callbacks: list[Callback]) -> Callable[[dict[str, float], Path | None], bool]:
    def report(metrics: dict[str, float], checkpoint: Path | None) -> bool:
        final = m.RUN_FINISHED in metrics
        event = Report(int(metrics[m.ENV_STEPS]), {k: v for k, v in metrics.items() if k != m.RUN_FINISHED},
                       checkpoint, final)
        return any([callback(event) is True for callback in callbacks]) and not final  # every callback sees it

    return report


class Policy:
    """A checkpoint's acting policy: observation normalizer, network and the env's action bounds."""

    def __init__(self, checkpoint: str | Path, env_creator: EnvCreator | None = None, trust_code: bool = False):
        import torch

        from aa_ray.algos.registry import build_policy
        from aa_ray.envs import env_dims
        from aa_ray.envs.make import first_observations
        from aa_ray.nets.policy import BoundedPolicy
        from aa_ray.runtime.checkpoint import CheckpointError, checkpoint_policy, load_checkpoint

        with _checkpoint_folder(checkpoint) as folder:
            saved = load_checkpoint(folder)
            if folder != Path(checkpoint):  # an MLflow model's policy data: messages name the model
                saved.folder = Path(str(checkpoint))
        if env_creator is not None:
            saved.spec = _with_creator(saved.spec, env_creator)
        self.checkpoint = saved.folder
        self.spec, state = checkpoint_policy(saved, trust_code=trust_code)
        obs, self.act_dim = env_dims(self.spec)
        # what `predict` and an exported file take: the actor's observation features (for a Dict
        # observation, its keys' features in `obs_keys` order; no privileged key is needed)
        self.obs_dim, self.obs_keys = obs.actor, obs.actor_keys
        self.network = build_policy(self.spec.algo, obs, self.act_dim)
        try:
            self.network.load_state_dict(state)
        except RuntimeError as err:
            raise CheckpointError(f"checkpoint {self.checkpoint}: its policy weights do not fit its own spec's "
                                  f"networks ({str(err).splitlines()[0]})") from None
        self.network.eval().requires_grad_(False)  # an exported file then needs no torch.no_grad()
        _, low, high = first_observations(self.spec, 1)
        self.bounded = BoundedPolicy(self.network, low, high).eval()
        self.generator = torch.Generator().manual_seed(self.spec.seed)

    def predict(self, obs: np.ndarray | Mapping[str, np.ndarray], deterministic: bool = True) -> np.ndarray:
        """Env actions for raw observations: shape (obs_dim,) gives (act_dim,), (N, obs_dim) gives
        (N, act_dim). A Dict-observation env's policy takes the env's dict (only the actor's keys,
        `obs_keys`, are read) or their features concatenated in that order. `deterministic=False`
        samples as the policy explores."""
        import torch

        from aa_ray.nets.policy import to_bounds

        if isinstance(obs, Mapping):
            missing = [key for key in self.obs_keys if key not in obs]
            if not self.obs_keys or missing:
                raise ValueError(f"the policy of {self.spec.env.id} reads observation keys {list(self.obs_keys)}; "
                                 f"got a dict with {sorted(obs)}")
            obs = np.concatenate([np.asarray(obs[key], dtype=np.float32) for key in self.obs_keys], axis=-1)
        batch = np.asarray(obs, dtype=np.float32)
        single = batch.ndim == 1
        if batch.shape[-1:] != (self.obs_dim,) or batch.ndim > 2:
            raise ValueError(f"expected observations of shape ({self.obs_dim},) or (N, {self.obs_dim}) for "
                             f"{self.spec.env.id}, got {batch.shape}")
        batch = batch[None] if single else batch
        with torch.no_grad():
            if deterministic:
                actions = self.bounded(torch.from_numpy(batch)).numpy()
            else:
                unit = self.network.act(batch, deterministic=False, generator=self.generator)
                actions = to_bounds(unit, self.bounded.low.numpy(), self.bounded.high.numpy())
        return actions[0] if single else actions

    def evaluate(self, episodes: int | None = None, video: str | Path | None = None) -> dict[str, float]:
        """Deterministic episodes on the eval seeds of the checkpoint's run (the starts its own
        evaluations faced): mean return and length, eval/success where the env reports is_success, and
        eval/<key> of its task metrics (`aa_ray.envs.info_metrics`). `video`: also write the first
        episode as a GIF (None written where nothing can render)."""
        from aa_ray.runtime.runners import runner_class

        spec = self.spec.model_copy(update={"runners": self.spec.runners.model_copy(update={"envs_per_runner": 1})})
        runner = runner_class(spec)(spec, 0)
        try:
            runner.set_weights(self.network.state_dict(), 0)
            result = runner.evaluate(episodes or self.spec.eval.episodes)
            if video is not None:
                gif, problem = runner.record_video(self.spec.eval.video_max_frames)
                if gif is None:
                    raise RuntimeError(f"cannot record {video}: {problem}")
                _prepare_to_write(Path(video), "video")
                Path(video).write_bytes(gif)
        finally:
            runner.close()
        return result

    def export(self, out: str | Path, format: Literal["torchscript", "onnx"]) -> Path:
        """Write the deterministic acting policy (raw observations in, env actions out) as a file
        that runs without aa-ray: TorchScript (`torch.jit.load`) or ONNX (`onnxruntime`). Its folder is
        made if missing; ExportError, with nothing written, if it cannot be made or written to."""
        import torch

        if format not in EXPORT_FORMATS:
            raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(EXPORT_FORMATS)}")
        out = Path(out)
        if out.is_dir():
            raise ExportError(f"export path {out} is a folder; pass the path of the file to write")
        example = torch.zeros(2, self.obs_dim)
        partial = out.with_name(out.name + ".partial")  # a failed export leaves no file behind
        _prepare_to_write(out, "policy file", first_write=partial)
        try:
            # serialized in memory, then written with Python's own I/O: torch's writers abort the process
            # (TorchScript) or leave an external-data file (ONNX) when the disk fills up under them
            with torch.no_grad():
                if format == "torchscript":
                    buffer = io.BytesIO()
                    torch.jit.save(torch.jit.trace(self.bounded, example), buffer)
                    data = buffer.getvalue()
                else:
                    data = _onnx_bytes(self.bounded, example)
            try:
                with open(partial, "wb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
            except OSError as err:
                raise ExportError(f"cannot write the policy file {out}: {write_failure(out, err)}; nothing was "
                                  "left behind.") from None
            partial.replace(out)
        finally:
            partial.unlink(missing_ok=True)
        return out


MLFLOW_MODEL_URIS = ("models:/", "runs:/")


@contextlib.contextmanager
def _checkpoint_folder(source: str | Path) -> Iterator[Path]:
    """The checkpoint folder a policy is read from: `source` itself, or the policy data inside an
    MLflow model aa-ray logged (a model folder, or a `models:/` or `runs:/` URI, downloaded to a
    temporary folder for as long as the block runs). A model's own code (its pyfunc loader, its
    pickled program) is never loaded: those run whatever their writer put there."""
    from aa_ray.runtime.checkpoint import MODEL_POLICY_FOLDER, CheckpointError

    with tempfile.TemporaryDirectory(prefix="aa-ray-model-") as scratch:
        folder = Path(source)
        if str(source).startswith(MLFLOW_MODEL_URIS):
            import mlflow.artifacts
            from mlflow.exceptions import MlflowException

            try:
                with _progress_bar_on_a_terminal_only():
                    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=str(source), dst_path=scratch))
            except (MlflowException, OSError) as err:
                raise CheckpointError(f"MLflow model {source} cannot be downloaded: {str(err).splitlines()[0]}") \
                    from None
        if (folder / "MLmodel").is_file():
            inside = folder / MODEL_POLICY_FOLDER
            if not inside.is_dir():
                raise CheckpointError(
                    f"MLflow model {source} holds no aa-ray policy data ({MODEL_POLICY_FOLDER}): it was not logged "
                    "by aa-ray, or by an aa-ray from before it was added. aa-ray does not load a model through its "
                    "own flavors, which run the code they ship; load it with mlflow.pyfunc.load_model if you "
                    "trust whoever made it."
                )
            folder = inside
        yield folder


@contextlib.contextmanager
def _progress_bar_on_a_terminal_only() -> Iterator[None]:
    """MLflow draws a progress bar for every download: on a terminal it shows a long one moving; in a
    log or a pipe it is lines of noise around aa-ray's own messages. Off there while the block runs."""
    variable = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if sys.stderr.isatty() or variable in os.environ:
        yield
        return
    os.environ[variable] = "false"
    try:
        yield
    finally:
        os.environ.pop(variable, None)


def _onnx_bytes(module: Any, example: Any) -> bytes:
    """`module` as an ONNX model (batch dimension dynamic), serialized. The exporter's warnings about
    optional packages it does without (torchvision) and torch's deprecations inside it are not the
    user's concern: they are kept off the terminal while it runs."""
    import torch

    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(module, (example,), None, input_names=["obs"], output_names=["action"],
                                        dynamic_shapes={"obs": {0: torch.export.Dim("batch")}}, dynamo=True,
                                        verbose=False)
    finally:
        exporter_log.setLevel(level)
    return program.model_proto.SerializeToString()


def _prepare_to_write(target: Path, what: str, first_write: Path | None = None) -> None:
    """Make `target`'s folder and open `first_write` (default: `target`) for writing once, so that a
    folder that cannot be made (a file in the way, no permission) or written to is one ExportError
    naming `target`, found before anything is written (torch would report it from deep inside its
    writers, as a traceback)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        (first_write or target).open("wb").close()
    except OSError as err:
        existing = next((p for p in target.parents if p.exists()), None)
        reason = err.strerror or type(err).__name__
        if existing is not None and not existing.is_dir():
            reason = f"{existing} is a file, not a folder"
        raise ExportError(f"cannot write the {what} {target}: {reason}.") from None


def load_policy(checkpoint: str | Path, env_creator: EnvCreator | None = None, *, trust_code: bool = False) -> Policy:
    """The acting policy of a checkpoint folder (CheckpointError for a missing or foreign one, or
    one whose policy holds a NaN or infinite weight).
    `env_creator`: the function that made the env of a run trained with one (`Experiment(...,
    env_creator=)`); it replaces the checkpoint's recorded `env.entry_point`.
    `trust_code`: a checkpoint is a file from whoever wrote it, and its stored spec may name code
    (an env entry point, modules to import, `env.py_modules`, a mirror, an algorithm plugin). That
    code runs only with `trust_code=True`; without it such a checkpoint is an UntrustedCodeError
    listing what would have been imported, and nothing is (`aa_ray.spec.trust`). Checkpoints of
    gymnasium's and aa-ray's own envs and algorithms name no code and need no opt-in."""
    return Policy(checkpoint, env_creator, trust_code)
