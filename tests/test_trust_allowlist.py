"""The trust boundary is an allowlist (issue 55): hypothesis draws stored specs that put a marker
command behind every field that names code, in every type and spelling an attacker tried (str,
bytes, aa-ray's own module prefixes with a dotted walk out of them, mirrors, controllers, plugins,
`module:` ids), plants each in a real checkpoint reached four ways (a checkpoint folder, an MLflow
model folder, `runs:/` and `models:/` URIs of a real store), reads it as `load_policy`, `aa-ray eval`,
`export` and `rollout --checkpoint` do, and asserts that the read is refused, the marker never
appears and the planted module is never imported. The planted module is importable by name (its
folder is on the import path), so only the allowlist stands between the file and the command."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from aa_ray import cli
from aa_ray.api import load_policy
from aa_ray.records import CheckpointParts, DriverCheckpoint, RunCounters
from aa_ray.runtime.checkpoint import MODEL_POLICY_FOLDER, STATE_FILE, CheckpointError, policy_only, save_checkpoint
from aa_ray.spec.loader import load_spec
from aa_ray.spec.trust import AA_RAYS_OWN_ENVS, UntrustedCodeError

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = ["algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]", "runners.envs_per_runner=1",
         "tracking.enabled=false", "runtime.backend=inline", "runners.num_runners=1"]
SPEC = load_spec(SPECS / "sac.yaml", SMALL)
PLANTED = "planted_marker_pkg"  # imported by nothing but a route that got through


def plant_package(root: Path, marker: Path) -> Path:
    """A package whose import runs `touch <marker>`; it also defines an env class, a mirror and an algorithm
    entry so that each field finds what it names."""
    package = root / PLANTED
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"import os\nos.system('touch {marker}')\nMIRROR = {{}}\n\ndef make_env(**kwargs):\n    return None\n")
    return package


def routes(marker: Path, package: Path) -> dict[str, Callable[[Callable[[str], Any]], dict[str, Any]]]:
    """Each route as the edit of the stored spec's sections, given how a name is spelled (`spell`: as a
    str, as bytes, or as a list holding it). A command that runs touches `marker`."""
    command = {"command": f"touch {marker}"}
    # (section, field, the name, the section's other fields)
    named: dict[str, tuple[str, str, str, dict[str, Any]]] = {
        "entry_point os:system": ("env", "entry_point", "os:system", {"kwargs": command}),
        "entry_point own module, dotted os.system": ("env", "entry_point", "aa_ray.envs.source:os.system",
                                                     {"kwargs": command}),
        "entry_point own module, dotted subprocess.run": ("env", "entry_point",
                                                          "aa_ray.tracking.mlflow_tracker:subprocess.run",
                                                          {"kwargs": {"args": ["touch", str(marker)]}}),
        "entry_point own function that imports": ("env", "entry_point", "aa_ray.envs.source:import_module",
                                                  {"kwargs": {"name": PLANTED, "field": "x", "env": None}}),
        "entry_point own controller": ("env", "entry_point", "aa_ray.envs.pusher_reach:scripted_action", {}),
        "entry_point planted module": ("env", "entry_point", f"{PLANTED}:make_env", {}),
        "module:id": ("env", "id", f"{PLANTED}:Their-v0", {}),
        "own module:id": ("env", "id", "aa_ray.envs.source:os", {}),
        "mirror": ("env", "mirror", f"{PLANTED}:MIRROR", {}),
        "mirror own module, dotted": ("env", "mirror", "aa_ray.envs.source:os.getpid", {}),
        "plugin": ("algo", "plugin", PLANTED, {"name": "their_algo"}),
        "plugin by installed name": ("algo", "name", "their_installed_algo", {}),
    }
    listed: dict[str, tuple[str, list[str], str]] = {  # fields that hold lists: (field, names before it, name)
        "imports": ("imports", [], PLANTED),
        "imports beside an own module": ("imports", ["aa_ray.envs"], PLANTED),
        "py_modules": ("py_modules", [], str(package)),
    }
    edits: dict[str, Callable[[Callable[[str], Any]], dict[str, Any]]] = {
        route: (lambda spell, section=section, field=field, name=name, rest=rest:
                {section: {**rest, field: spell(name)}})
        for route, (section, field, name, rest) in named.items()
    }
    edits |= {route: (lambda spell, field=field, before=before, name=name:
                      {"env": {field: [*before, spell(name)]}})
              for route, (field, before, name) in listed.items()}
    return edits


SPELLINGS: dict[str, Callable[[str], Any]] = {
    "str": lambda name: name, "bytes": lambda name: name.encode(), "list": lambda name: [name],
    "bytes in a list": lambda name: [name.encode()],
}


def edited(base: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    spec = {key: dict(value) if isinstance(value, dict) else value for key, value in base.items()}
    for section, fields in edit.items():
        spec[section].update(fields)
    return spec


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real checkpoint's contents (a learner's weights for pusher-reach), to plant specs into."""
    from aa_ray.runtime.learner import Learner

    state = CheckpointParts(learner=Learner(SPEC, 10, 2).state_dict(),
                            driver=DriverCheckpoint(RunCounters(0, 0, 0, next_eval=1000), [], [], {}))
    folder = save_checkpoint(tmp_path_factory.mktemp("ckpt") / "final", SPEC, state)
    return torch.load(folder / STATE_FILE, weights_only=True)


class Containers:
    """The places a planted state file is read from: a checkpoint folder, an MLflow model folder, and a
    model logged to the test's MLflow store, by `runs:/` and by registered `models:/` URI."""

    def __init__(self, root: Path, payload: dict[str, Any]):
        from aa_ray.tracking.models import save_policy_model

        self.folder = root / "checkpoint"
        self.folder.mkdir()
        model = root / "model"
        policy = payload["learner"]["algo"]["policy"]  # the real checkpoint's acting policy
        save_policy_model(SPEC, policy, model, "policy", 0)
        save_checkpoint(model / MODEL_POLICY_FOLDER, SPEC, policy_only(policy))
        self.model = model
        with mlflow.start_run() as run:
            mlflow.log_artifacts(str(model), "policy")
        client = MlflowClient()
        client.create_registered_model("theirs")
        client.create_model_version("theirs", source=f"runs:/{run.info.run_id}/policy", run_id=run.info.run_id)
        self.uris = {"runs:/": f"runs:/{run.info.run_id}/policy", "models:/": "models:/theirs/1"}
        artifacts = run.info.artifact_uri
        # the store's own copies of the state file, which the URIs resolve to
        self.store_files = list(Path(local_file_uri_to_path(artifacts) if artifacts.startswith("file:")
                                     else artifacts).rglob(STATE_FILE))
        self.base = payload

    def plant(self, where: str, spec: dict[str, Any]) -> str:
        """Write a state file holding `spec` into the container `where`; the reference a user passes."""
        planted = {**self.base, "spec": spec}
        if where == "folder":
            torch.save(planted, self.folder / STATE_FILE)
            return str(self.folder)
        if where == "model folder":
            torch.save(planted, self.model / MODEL_POLICY_FOLDER / STATE_FILE)
            return str(self.model)
        assert self.store_files, "the test store keeps its artifacts on this file system"
        for file in self.store_files:
            torch.save(planted, file)
        return self.uris[where]


READERS: dict[str, Callable[[str, Path], None]] = {
    "load_policy": lambda ref, tmp: load_policy(ref),
    "aa-ray eval": lambda ref, tmp: _command(["eval", ref, "--episodes", "1"]),
    "aa-ray export": lambda ref, tmp: _command(["export", ref, "--format", "onnx", "--out", str(tmp / "p.onnx")]),
    "rollout --checkpoint": lambda ref, tmp: _rollout(ref, tmp),
}


def _command(argv: list[str]) -> None:
    if cli.main(argv) != 2:
        raise AssertionError(f"aa-ray {argv[0]} did not refuse the file")


def _rollout(ref: str, tmp: Path) -> None:
    from aa_ray.rollout.job import policy_from_checkpoint

    policy_from_checkpoint(SPEC, ref)


@pytest.mark.timeout(300)
def test_no_stored_spec_runs_code_whatever_the_field_spelling_container_or_reader(
    payload: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    package = plant_package(tmp_path / "pkgs", marker)
    monkeypatch.syspath_prepend(str(package.parent))  # importable by name: only the allowlist stops it
    containers = Containers(tmp_path, payload)
    paths = routes(marker, package)
    seen: set[tuple[str, str]] = set()

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(route=st.sampled_from(sorted(paths)), spelling=st.sampled_from(sorted(SPELLINGS)),
           where=st.sampled_from(["folder", "model folder", "runs:/", "models:/"]),
           reader=st.sampled_from(sorted(READERS)))
    def check(route: str, spelling: str, where: str, reader: str) -> None:
        if where != "folder" and reader == "rollout --checkpoint":
            reader = "load_policy"  # a rollout reads checkpoint folders only
        ref = containers.plant(where, edited(payload["spec"], paths[route](SPELLINGS[spelling])))
        try:
            READERS[reader](ref, tmp_path)
        except (UntrustedCodeError, CheckpointError) as refused:
            said = str(refused)
            assert "--trust-code" in said or "damaged" in said, said
        else:
            if reader in ("load_policy", "rollout --checkpoint"):
                raise AssertionError(f"{route} ({spelling}) in a {where} was read by {reader}")
        assert not marker.exists(), (route, spelling, where, reader)
        assert PLANTED not in sys.modules, (route, spelling, where, reader)
        seen.add((route, where))

    check()
    assert {route for route, _ in seen} == set(paths)  # every route was tried, through
    assert {where for _, where in seen} == {"folder", "model folder", "runs:/", "models:/"}


def test_the_allowlist_is_exact_and_names_real_envs() -> None:
    """The table's entries are aa-ray's env classes; a longer, shorter or dotted spelling of one is not."""
    import gymnasium as gym

    from aa_ray.envs.source import import_object
    from aa_ray.spec.trust import named_code

    env = type("Env", (), {"py_modules": ()})()
    for entry in AA_RAYS_OWN_ENVS:
        found = import_object(entry, "env.entry_point", env, "Env")
        assert isinstance(found, type) and (issubclass(found, gym.Env) or hasattr(found, "step")), entry
        assert named_code({"env": {"entry_point": entry}}) == []
        for spelling in (entry + "X", entry.replace(":", "."), entry + ".__init__", " " + entry, entry.upper()):
            assert named_code({"env": {"entry_point": spelling}}), spelling
