"""What only the machine a spec was written on can check, before `aa-ray run` starts anything: the
`env.py_modules` folders exist here at a size Ray ships, `budget.stop_at` names a metric the
evaluations produce (the env is made to read its declared task metrics), a robot task's copies fit
this machine's memory, and the mirror of `algo.sym_aug` fits the env. The spec's models
(`experiment.py`) check what holds wherever a spec is validated: a Ray worker, a Tune trial, a
checkpoint's stored spec; these do not belong there.
"""

from __future__ import annotations

import os

from aa_ray import metric_names as m
from aa_ray.errors import SpecError
from aa_ray.spec.experiment import ExperimentSpec

# A package folder Ray uploads (zipped) to every worker: its upload limit is 512 MiB and it warns at
# half that; a folder past either bound is not the package meant (a home folder, a data folder).
MAX_PY_MODULE_BYTES = 256 << 20
MAX_PY_MODULE_FILES = 20_000



def check_py_modules_here(py_modules: list[str]) -> None:
    """ValueError unless each env.py_modules entry is a folder on this machine of a size to ship. Only
    where the spec was written: a Ray worker, a trial or a resumed checkpoint elsewhere gets the
    package through Ray's runtime env, not from this path."""
    for i, path in enumerate(py_modules):
        if not os.path.isdir(path):
            what = "is a file, not a folder" if os.path.exists(path) else "does not exist"
            raise ValueError(
                f"env.py_modules.{i}: {path!r} {what} (from {os.getcwd()}); name a local package folder (one with "
                "__init__.py), relative to the folder aa-ray runs in, or remove it if the package is installed"
            )
        files, size = _folder_size(os.path.realpath(path))
        if files > MAX_PY_MODULE_FILES or size > MAX_PY_MODULE_BYTES:
            raise ValueError(
                f"env.py_modules.{i}: {path!r} holds more than {MAX_PY_MODULE_FILES:,} files or "
                f"{MAX_PY_MODULE_BYTES >> 20} MiB, which Ray would zip and upload to every worker (its limit is "
                "512 MiB); name the package folder itself, and keep data and checkpoints out of it"
            )


def _folder_size(root: str) -> tuple[int, int]:
    """(files, bytes) under a folder, counting stopped once either passes its bound (links not followed)."""
    files = size = 0
    folders = [root]
    while folders and files <= MAX_PY_MODULE_FILES and size <= MAX_PY_MODULE_BYTES:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:
            continue  # an unreadable folder is Ray's to report; it adds nothing here
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                else:
                    files += 1
                    size += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return files, size


def check_stop_metric(spec: ExperimentSpec) -> None:
    """SpecError when `budget.stop_at` names an eval metric the run's evaluations never produce:
    not eval/return, eval/length, eval/success, nor a task metric the env declares or the spec lists
    in eval.info_metrics (the env is made once to read its declared ones). The shorthands are not
    checked: an env without their metric skips them, as it always did."""
    from aa_ray.envs.info_metrics import metric_name
    from aa_ray.envs.make import task_metric_keys

    rule = spec.budget.stop_at
    builtin = (m.EVAL_RETURN, m.EVAL_LENGTH, m.EVAL_SUCCESS, m.EVAL_AT_ENV_STEPS)
    if rule is None or rule.metric in builtin or rule.metric.removeprefix(m.EVAL_PREFIX) in spec.eval.info_metrics:
        return
    produced = [*builtin[:3], *(m.EVAL_PREFIX + metric_name(key) for key in task_metric_keys(spec))]
    if rule.metric not in produced:
        raise SpecError(
            f"budget.stop_at.metric: the evaluations of {spec.env.id} never produce {rule.metric}, so the run "
            f"could not stop on it; they produce {', '.join(dict.fromkeys(produced))} (eval/success only where the "
            f"env reports info['is_success']). Name one of those, or list the info key in eval.info_metrics."
        )


# the package each tracking backend beside MLflow writes with, and the extra that installs it
BACKEND_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_tracking_packages(spec: ExperimentSpec) -> None:
    """ValueError unless every tracking backend a tracked run names has its client installed here (a
    checkpoint's spec read where it is not installed is fine: only a run writes to it)."""
    if not spec.tracking.enabled:
        return
    import importlib.util

    for backend in spec.tracking.backends:
        package = BACKEND_PACKAGES.get(backend)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ValueError(
                f"tracking.backends: {backend} needs the {package} package, which is not installed here: "
                f"pip install 'aa-ray[{backend}]', or remove {backend} from tracking.backends"
            )


def check_here(spec: ExperimentSpec) -> None:
    """What `aa-ray run` would fail on before it starts anything, beyond what the model checks wherever a
    spec is validated (Ray workers, trials, a checkpoint's stored spec): the env.py_modules folders exist
    here, at a size to ship; budget.stop_at names a metric the evaluations produce; the mirror of
    algo.sym_aug fits the env's observations and actions; a robot task's copies fit this machine's memory
(`envs.memory`). Both `aa-ray validate` and `aa-ray run` call
    it through `loader.load_spec`. The env is made only for the last two, and only where they apply.
    ValueError naming the field."""
    check_py_modules_here(spec.env.py_modules)
    check_tracking_packages(spec)
    check_stop_metric(spec)
    from aa_ray.envs.memory import check_memory

    check_memory(spec)
    if spec.algo.sym_aug:
        from aa_ray.envs.make import env_dims
        from aa_ray.envs.symmetry import sym_aug_mirror

        sym_aug_mirror(spec, *env_dims(spec))
