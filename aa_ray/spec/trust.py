"""The code a spec names, and the rule for specs that come inside someone else's file.

A spec the user passes on the command line (or to the Python API) is theirs: the modules it names
(`env.entry_point`, `env.imports`, gymnasium's `module:EnvId`, `env.mirror`, `algo.plugin`) and
the folders it puts on the import path (`env.py_modules`) are imported because the user asked.
A spec stored inside a checkpoint travels with the checkpoint (a colleague's run folder, a download)
and names code the user never saw: validating it, or making its env, would import that code. So
what such a spec names runs only when the user opts in (`--trust-code`, `trust_code=True`, as
transformers' `trust_remote_code`), or when the user's own spec names the same thing. The refusal
lists exactly what would have been imported, and nothing has been imported when it is raised:
`named_code` reads the raw dict, before pydantic (whose validators import).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from aa_ray.errors import UserError, clip


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
    """The strings of a field that should be a string or a list of them (anything else is left for
    validation to refuse: it names no code that could be imported)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def _aa_rays_own(path: str) -> bool:
    """A module of aa-ray's own package (`aa_ray.envs.point_reach:PointReach`): installed code, which the
    file names but did not bring (a folder the file puts on the import path is named on its own)."""
    module = _module_of(path)
    return module == "aa_ray" or module.startswith("aa_ray.")


def named_code(raw: Mapping[str, Any]) -> list[NamedCode]:
    """Every module import and import-path change a raw spec dict would cause when validated or when
    its env and algorithm are built. aa-ray's own and gymnasium's registered env ids, aa-ray's own
    modules and aa-ray's own algorithms name none (their code is installed, not named by the file)."""
    env = raw.get("env") if isinstance(raw.get("env"), Mapping) else {}
    algo = raw.get("algo") if isinstance(raw.get("algo"), Mapping) else {}
    found: list[NamedCode] = []
    for folder in _strings(env.get("py_modules")):
        found.append(NamedCode("env.py_modules", folder, "puts this folder's packages on the import path"))
    for entry_point in (e for e in _strings(env.get("entry_point")) if not _aa_rays_own(e)):
        module, _, attr = entry_point.partition(":")
        found.append(NamedCode("env.entry_point", entry_point, f"imports module {module!r} and calls {attr!r} "
                               "with env.kwargs to make the env"))
    for module in (m for m in _strings(env.get("imports")) if not _aa_rays_own(m)):
        found.append(NamedCode("env.imports", module, f"imports module {module!r}"))
    for env_id in _strings(env.get("id")):
        if ":" in env_id and not _aa_rays_own(env_id):
            found.append(NamedCode("env.id", env_id, f"imports module {_module_of(env_id)!r}"))
    for mirror in (m for m in _strings(env.get("mirror")) if not _aa_rays_own(m)):
        found.append(NamedCode("env.mirror", mirror, f"imports module {_module_of(mirror)!r} and calls what it "
                               "names on observations and actions"))
    for plugin in _strings(algo.get("plugin")):
        found.append(NamedCode("algo.plugin", plugin, f"imports module {plugin!r} and trains with its algorithm"))
    return found


def refuse_untrusted_code(raw: Mapping[str, Any], file: str, trust_code: bool,
                          named_by_user: Collection[NamedCode] = (), instead: str = "") -> None:
    """UntrustedCodeError unless every piece of code the spec stored in `file` names is also named by
    the user (`named_by_user`, from the spec they passed) or they opted in with `trust_code`.
    `instead`: what else the user can do, ending the message."""
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
