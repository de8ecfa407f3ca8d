"""The code a spec names, and the rule for specs that come inside someone else's file: an allowlist.

A spec the user passes on the command line (or to the Python API) is theirs: the modules it names
(`env.entry_point`, `env.imports`, gymnasium's `module:EnvId`, `env.mirror`, `algo.plugin`, an
installed plugin's `algo.name`) and the folders it puts on the import path (`env.py_modules`) are
imported because the user asked. A spec stored inside a checkpoint travels with the checkpoint (a
colleague's run folder, a download) and names code the user never saw: validating it, or making its
env, would import that code.

So a stored spec's code is imported only if it is allowed by name, exactly: the same string in the
same field of the user's own spec, or an entry of aa-ray's own table (`aa_rays_own`: its env classes
and algorithms). There is no prefix rule and no list of what may be dangerous: anything not on the list
needs the user's opt-in (`--trust-code`, `trust_code=True`, as transformers' `trust_remote_code`).
The refusal lists exactly what would have been imported, and nothing has been imported when it is
raised: `named_code` reads the raw dict, before pydantic (whose validators import).

The allowlist compares strings, so a stored spec must hold strings where a spec names code, a path
or an id: `stored_type_errors` finds any other type there (bytes, which pydantic's lax `str` would
turn into the string it then imports; a number; a list where one name belongs), and the checkpoint
reader refuses such a spec as damaged before anything reads it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from aa_ray.errors import UserError, clip

# aa-ray's own code a stored spec may name without the user's say, by field and exact string. Its
# registered env ids (aa_ray/PusherReach-v0) and gymnasium's name no module, and its own mirrors are
# found by env id (`aa_ray.envs.symmetry.MIRRORS`), never by path. The scripted controllers its envs
# declare (`aa_ray.envs.pusher_reach:scripted_action`) are named by the env class's metadata, not
# by a file: a file reaches one only through an env this table or the user allowed.
AA_RAYS_OWN_ENVS = frozenset({"aa_ray.envs.pusher_reach:PusherReachEnv", "aa_ray.envs.point_reach:PointReach"})


def aa_rays_own(field: str) -> frozenset[str]:
    """The exact strings of aa-ray's own code that `field` may name in a stored spec."""
    if field == "env.entry_point":
        return AA_RAYS_OWN_ENVS
    if field == "algo.name":
        from aa_ray.algos.registry import ALGORITHMS  # spec/ is imported by the algorithm configs' module

        return frozenset(ALGORITHMS)
    return frozenset()


# Every field of a spec that names code, a path or an id, with the types a stored spec may hold there
# (absent means the default). Anything else is damage: the allowlist compares strings.
TEXT = "a string"
TEXT_OR_NULL = "a string or null"
TEXT_LIST = "a list of strings"
TEXT_FIELDS: dict[tuple[str, ...], str] = {
    ("name",): TEXT,
    ("env", "id"): TEXT,
    ("env", "entry_point"): TEXT_OR_NULL,
    ("env", "imports"): TEXT_LIST,
    ("env", "py_modules"): TEXT_LIST,
    ("env", "mirror"): TEXT_OR_NULL,
    ("env", "batched"): TEXT_OR_NULL,
    ("env", "device"): TEXT,
    ("algo", "name"): TEXT,
    ("algo", "plugin"): TEXT_OR_NULL,
    ("algo", "prior_data"): TEXT_OR_NULL,
    ("runtime", "output_dir"): TEXT,
}


def _holds(value: Any, shape: str) -> bool:
    if shape == TEXT_LIST:
        return isinstance(value, list) and all(type(item) is str for item in value)
    return type(value) is str or (shape == TEXT_OR_NULL and value is None)


def stored_type_errors(raw: Mapping[str, Any]) -> list[str]:
    """Each field of a stored spec that should name code, a path or an id but holds another type,
    as "env.entry_point holds bytes, not a string". A section that is not a mapping is left for
    validation to refuse (nothing in it can be imported)."""
    found = []
    for path, shape in TEXT_FIELDS.items():
        section: Any = raw
        for key in path[:-1]:
            section = section.get(key) if isinstance(section, Mapping) else None
        if not isinstance(section, Mapping) or path[-1] not in section:
            continue
        value = section[path[-1]]
        if not _holds(value, shape):
            found.append(f"{'.'.join(path)} holds {type(value).__name__} {clip(repr(value), 80)}, not {shape}")
    return found


@dataclass(frozen=True)
class NamedCode:
    """One piece of code a spec names: the field, its value and what loading it would do."""

    field: str
    value: str
    effect: str

    def describe(self) -> str:
        return f"{self.field} {clip(self.value, 120)!r} ({self.effect})"


class UntrustedCodeError(UserError):
    """A file someone else wrote names code, and the user did not opt in to running it."""


def _module_of(path: str) -> str:
    return path.partition(":")[0]


def _strings(value: Any) -> list[str]:
    """The strings of a field that should be a string or a list of them. Other types are damage that
    `stored_type_errors` finds first; here they name nothing, and a user's spec never holds them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def every_named_code(raw: Mapping[str, Any]) -> list[NamedCode]:
    """Every module import and import-path change a raw spec dict would cause when validated or when
    its env and algorithm are built, aa-ray's own included."""
    env = raw.get("env") if isinstance(raw.get("env"), Mapping) else {}
    algo = raw.get("algo") if isinstance(raw.get("algo"), Mapping) else {}
    found: list[NamedCode] = []
    for folder in _strings(env.get("py_modules")):
        found.append(NamedCode("env.py_modules", folder, "puts this folder's packages on the import path"))
    for entry_point in _strings(env.get("entry_point")):
        module, _, attr = entry_point.partition(":")
        found.append(NamedCode("env.entry_point", entry_point, f"imports module {module!r} and calls {attr!r} "
                               "with env.kwargs to make the env"))
    for module in _strings(env.get("imports")):
        found.append(NamedCode("env.imports", module, f"imports module {module!r}"))
    for env_id in _strings(env.get("id")) if env.get("entry_point") is None else []:  # else only a label
        if ":" in env_id:
            found.append(NamedCode("env.id", env_id, f"imports module {_module_of(env_id)!r}"))
    for mirror in _strings(env.get("mirror")):
        found.append(NamedCode("env.mirror", mirror, f"imports module {_module_of(mirror)!r} and calls what it "
                               "names on observations and actions"))
    plugins = _strings(algo.get("plugin"))
    for plugin in plugins:
        found.append(NamedCode("algo.plugin", plugin, f"imports module {plugin!r} and trains with its algorithm"))
    for name in _strings(algo.get("name")) if not plugins else []:
        found.append(NamedCode("algo.name", name, "imports the installed package that registers an algorithm of "
                               "this name (entry point group aa_ray.algorithms)"))
    return found


def named_code(raw: Mapping[str, Any]) -> list[NamedCode]:
    """The code a raw spec names beyond aa-ray's own table (`aa_rays_own`): what a user must trust
    before a file holding this spec is loaded."""
    return [code for code in every_named_code(raw) if code.value not in aa_rays_own(code.field)]


def refuse_untrusted_code(raw: Mapping[str, Any], file: str, trust_code: bool,
                          named_by_user: Collection[NamedCode] = (), instead: str = "") -> None:
    """UntrustedCodeError unless every piece of code the spec stored in `file` names is aa-ray's own,
    or named by the user in the same field with the same string (`named_by_user`, from the spec they
    passed), or they opted in with `trust_code`. `instead`: what else the user can do, ending the
    message."""
    if trust_code:
        return
    own = {(code.field, code.value) for code in named_by_user}
    foreign = [code for code in named_code(raw) if (code.field, code.value) not in own]
    if foreign:
        raise UntrustedCodeError(
            f"{file} was written with a spec that names code, and loading it would run that code: "
            f"{'; '.join(code.describe() for code in foreign)}. Nothing was imported. A file holds whatever its "
            "writer put in it: if you trust whoever wrote it and that code, pass --trust-code (Python API: "
            f"trust_code=True).{' ' + instead if instead else ''}"
        )
