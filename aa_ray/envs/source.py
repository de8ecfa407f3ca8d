"""Where the spec's env comes from: a gymnasium id (registered by aa-ray, gymnasium, or a module the
spec names in `env.imports`; gymnasium's `module:EnvId` form imports its module itself), or an env
class or creator named by import path (`env.entry_point: mypkg.envs:MyRobotEnv`) or passed as a
callable through the Python API. Local packages named in `env.py_modules` are put on this
process's import path (Ray ships them to the workers as its runtime env's `py_modules`).

`prepare` runs in every process that makes the env (the driver's validation, each env runner,
evaluation, rollouts, Tune trials, `eval` and `export`): importing is idempotent, so it is cheap
after the first time. Errors are `EnvSourceError`, a ValueError whose message says what to fix.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec as GymEnvSpec

from aa_ray.envs.pusher_reach import register_envs
from aa_ray.errors import what_user_code_did

# the batched sources (aa_ray.envs.batched) whose env.id is a task name of their own: no gymnasium id to
# register, no env class of ours to import
OWN_TASK_SOURCES = ("envpool", "playground", "unilab")


class EnvSourceError(ValueError):
    """The spec's env cannot be found or imported; the message is for the user."""


class EnvSource(Protocol):
    """What of the spec's `env` section this module reads (the pydantic model `spec.experiment.EnvSpec`)."""

    id: str
    entry_point: str | Callable[..., gym.Env] | None
    imports: Sequence[str]
    py_modules: Sequence[str]
    batched: str | None  # a batched env's source (aa_ray.envs.batched), None for a gymnasium env


def registered_id(env_id: str) -> str:
    """The registry id of `module:EnvId` (or of a plain id, itself)."""
    return env_id.split(":", 1)[1] if ":" in env_id else env_id


def id_module(env_id: str) -> str | None:
    """The module of gymnasium's `module:EnvId` form, or None."""
    return env_id.split(":", 1)[0] if ":" in env_id else None


def add_local_packages(py_modules: Sequence[str]) -> None:
    """Make `env.py_modules` (package folders, resolved against the current directory) importable in
    this process: their parent folders go on the import path. A path that does not exist here is
    skipped: on a Ray worker of another node the package arrives through the runtime env instead,
    and an import that still fails names the path."""
    for path in py_modules:
        root = str(Path(os.path.abspath(path)).parent)
        if os.path.exists(path) and root not in sys.path:
            sys.path.insert(0, root)


def import_module(name: str, field: str, env: EnvSource) -> Any:
    try:
        return importlib.import_module(name)
    # an import runs the user's code: any exception is theirs, and so is a sys.exit() at import time,
    # which would otherwise end `validate` or `run` with its exit code (0) and no word
    except (Exception, SystemExit) as err:
        raise EnvSourceError(import_failure(name, field, err, env.py_modules)) from err


def import_failure(name: str, field: str, err: BaseException, py_modules: Sequence[str] = ()) -> str:
    """The message for a module of the user's that could not be imported, by what went wrong: not
    found, exited, or raised."""
    where = f" (env.py_modules: {', '.join(py_modules)})" if py_modules else ""
    missing = isinstance(err, ModuleNotFoundError) and err.name == name.split(".")[0]
    hint = (
        f"make {name!r} importable: install it, put its folder on PYTHONPATH, or name the package folder in "
        "env.py_modules" if missing else f"fix the error in {name!r}"
    )
    return (f"{field}: importing {name!r}{where} failed in process {os.getpid()} on {os.uname().nodename} "
            f"(it {what_user_code_did(err)}); {hint}.")


def import_object(path: str, field: str, env: EnvSource, what: str) -> Any:
    """The object `module:name` names, for the spec field `field`; `what` says what it should be, for
    the error when the form is wrong. `name` must be defined in that module (a class or function whose
    `__module__` it is, a non-callable value bound there, or any name its `__all__` lists): never an
    attribute path, a module, or a callable the module only imported (`aa_ray.envs.source:os.system`
    would reach `os` through a module the spec is allowed to name)."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise EnvSourceError(f"{field}: {path!r} is not of the form module:{what}.")
    if not name.isidentifier():
        raise EnvSourceError(
            f"{field}: {path!r} names {name!r}, which is not one name: name the class, function or object in the "
            f"module that defines it (module:{what})."
        )
    module = import_module(module_name, field, env)
    if not hasattr(module, name):
        hint = (
            " It names a creator defined in a script or notebook: pass the same function again "
            "(load_policy(checkpoint, env_creator=...), Experiment(..., env_creator=...))."
            if module_name == "__main__" else ""
        )
        raise EnvSourceError(f"{field}: module {module_name!r} has no attribute {name!r}.{hint}")
    target = getattr(module, name)
    if not _defined_in(module, name, target):
        what_it_is = (f"module {target.__name__!r}" if inspect.ismodule(target)
                      else f"{name!r}, defined in module {getattr(target, '__module__', None)!r},")
        raise EnvSourceError(
            f"{field}: {path!r} names {what_it_is} which {module_name!r} imports rather than defines; name it in "
            f"the module that defines it, or list {name!r} in {module_name}.__all__."
        )
    return target


def _defined_in(module: Any, name: str, target: Any) -> bool:
    """Whether `module.name` is the module's own and not a module: listed in its `__all__`, or, for a
    class or function, defined there (its `__module__`), or a value that is not callable (a mirror's
    mapping, a dataclass instance: data the caller checks, which cannot be told apart from an import)."""
    if inspect.ismodule(target):
        return False
    exported = getattr(module, "__all__", ())
    if isinstance(exported, list | tuple) and name in exported:
        return True
    if inspect.isclass(target) or inspect.isroutine(target):
        return getattr(target, "__module__", None) == module.__name__
    return not callable(target)


def resolve_entry_point(entry_point: str | Callable[..., gym.Env], env: EnvSource) -> Callable[..., gym.Env]:
    """The env class or creator `module:attr` names (a callable is itself). Refuses a class that is
    not a gymnasium Env and anything that is not callable."""
    target = entry_point if callable(entry_point) else import_object(
        entry_point, "env.entry_point", env, "ClassOrFunction (e.g. mypkg.envs:MyRobotEnv)"
    )
    # a batched env (env.batched) is an object of its own shape (Isaac Lab's, EnvPool's), not a gymnasium Env
    if isinstance(target, type) and not issubclass(target, gym.Env) and getattr(env, "batched", None) is None:
        raise EnvSourceError(
            f"env.entry_point: {entry_point!r} is a class but not a gymnasium Env (a subclass of gymnasium.Env); "
            "name the env class, or a function that returns an env."
        )
    if not callable(target):
        raise EnvSourceError(
            f"env.entry_point: {entry_point!r} is a {type(target).__name__}, not an env class or a function that "
            "returns an env."
        )
    return target


def prepare(env: EnvSource) -> None:
    """Import what the spec names, in this process, so that its env id is registered (or its entry
    point importable). EnvSourceError when an import fails or the id is still unknown."""
    add_local_packages(env.py_modules)
    for name in env.imports:
        import_module(name, "env.imports", env)
    if env.entry_point is not None:
        resolve_entry_point(env.entry_point, env)
        return
    if getattr(env, "batched", None) in OWN_TASK_SOURCES:
        return  # the sources' own task ids: the adapter checks the id against their lists
    if getattr(env, "batched", None) == "torch":
        raise EnvSourceError(
            "env.batched: torch calls the env's class or creator itself: name it in env.entry_point "
            "(e.g. aa_ray.envs.point_reach:PointReach)."
        )
    module = id_module(env.id)
    if module is not None:
        import_module(module, "env.id", env)
    register_envs()  # aa_ray/PusherReach-v0, for a process that made no other aa_ray.envs import

    env_id = registered_id(env.id)
    if env_id not in gym.registry:
        imported = [*env.imports, *([module] if module else [])]
        if imported:
            hint = f"after importing {', '.join(imported)} it is still not registered: check the ids they register"
        else:
            hint = (
                "if a package of yours registers it, name that package in env.imports (or write env.id as "
                "'package:Id'); an env class that is not registered can be named by env.entry_point"
            )
        from difflib import get_close_matches

        close = get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        suggestion = f" Did you mean {', '.join(close)}?" if close else ""
        raise EnvSourceError(
            f"env.id: unknown gymnasium env id {env_id!r} in process {os.getpid()} on {os.uname().nodename}: "
            f"{hint}.{suggestion}"
        )


def make_target(env: EnvSource) -> str | GymEnvSpec:
    """What `gym.make` / `gym.make_vec` take for this env: the id, or for an entry point an unregistered
    gymnasium EnvSpec (nothing is added to gymnasium's registry; the time limit comes from the
    `max_episode_steps` keyword, `env_kwargs`)."""
    if env.entry_point is None:
        return env.id
    gym_id = re.sub(r"[^\w:.-]", "_", entry_point_label(env.entry_point))  # gymnasium parses the id of a spec
    return GymEnvSpec(id=gym_id, entry_point=resolve_entry_point(env.entry_point, env))


def entry_point_label(entry_point: str | Callable[..., Any]) -> str:
    """`module:qualname` of an entry point: what the spec records (and the default env id)."""
    if isinstance(entry_point, str):
        return entry_point
    return f"{getattr(entry_point, '__module__', '?')}:{getattr(entry_point, '__qualname__', repr(entry_point))}"
