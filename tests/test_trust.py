"""Files someone else wrote run no code: a command planted in each kind of file aa-ray reads
(a checkpoint's stored spec, its state file, a Minari dataset's metadata, a Parquet dataset's schema)
is refused in one message naming what would have run, and the planted command never runs; with
`--trust-code` (`trust_code=True`) the code a checkpoint names does run, because the user asked."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from aa_ray import cli
from aa_ray.api import load_policy
from aa_ray.data.dataset import DatasetError
from aa_ray.data.sources import read_dataset
from aa_ray.envs.make import EnvSetupError
from aa_ray.records import CheckpointParts, DriverCheckpoint, RunCounters
from aa_ray.runtime.checkpoint import STATE_FILE, CheckpointError, load_checkpoint, save_checkpoint
from aa_ray.spec.loader import load_spec, spec_to_dict
from aa_ray.spec.trust import UntrustedCodeError, named_code

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = ["algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]", "runners.envs_per_runner=1",
         "tracking.enabled=false", "runtime.backend=inline", "runners.num_runners=1"]
SPEC = load_spec(SPECS / "sac.yaml", SMALL)


class PlantedCommand:
    """Unpickling this runs `touch <marker>`: what a hostile pickle inside a file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint of pusher-reach: a learner's weights, no replay (eval and export need none)."""
    from aa_ray.runtime.learner import Learner

    state = CheckpointParts(learner=Learner(SPEC, 10, 2).state_dict(),
                            driver=DriverCheckpoint(RunCounters(0, 0, 0, next_eval=1000), [], [], {}))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "final", SPEC, state)


def planted(checkpoint: Path, tmp_path: Path, edit) -> tuple[Path, Path]:
    """A copy of `checkpoint` whose stored spec was edited by `edit(spec_dict, marker)`; the marker
    file exists only if something ran the planted command."""
    marker = tmp_path / "ran"
    payload = torch.load(checkpoint / STATE_FILE, weights_only=True)
    edit(payload["spec"], marker)
    folder = tmp_path / "theirs"
    folder.mkdir()
    torch.save(payload, folder / STATE_FILE)
    return folder, marker


def os_system_entry_point(spec: dict, marker: Path) -> None:
    spec["env"].update(entry_point="os:system", kwargs={"command": f"touch {marker}"})


def planted_package(tmp_path: Path, marker: Path) -> Path:
    """A package whose import runs the command: what env.imports, env.mirror or algo.plugin import."""
    package = tmp_path / "pkgs" / "their_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"import os\nos.system('touch {marker}')\nMIRROR = None\n")
    return package


def with_imports(spec: dict, marker: Path) -> None:
    spec["env"].update(imports=["their_pkg"], py_modules=[str(planted_package(marker.parent, marker))])


def with_module_id(spec: dict, marker: Path) -> None:
    spec["env"].update(id="their_pkg:Pusher-v0", py_modules=[str(planted_package(marker.parent, marker))])


def with_mirror(spec: dict, marker: Path) -> None:
    spec["env"].update(mirror="their_pkg:MIRROR", py_modules=[str(planted_package(marker.parent, marker))])


def with_plugin(spec: dict, marker: Path) -> None:
    planted_package(marker.parent, marker)
    spec["env"]["py_modules"] = [str(marker.parent / "pkgs" / "their_pkg")]
    spec["algo"].update(name="their_algo", plugin="their_pkg")


PLANTS = {"entry point": os_system_entry_point, "imports": with_imports, "module:id": with_module_id,
          "mirror": with_mirror, "plugin": with_plugin}


@pytest.mark.parametrize("plant", PLANTS.values(), ids=PLANTS.keys())
def test_load_policy_refuses_a_checkpoint_whose_spec_names_code(checkpoint: Path, tmp_path: Path, plant) -> None:
    folder, marker = planted(checkpoint, tmp_path, plant)
    with pytest.raises(UntrustedCodeError) as refused:
        load_policy(folder)
    message = str(refused.value)
    assert str(folder) in message and "--trust-code" in message and "Nothing was imported" in message
    assert ("os:system" in message) if plant is os_system_entry_point else ("their_pkg" in message)
    assert not marker.exists()
    assert "their_pkg" not in sys.modules


def test_the_commands_refuse_it_in_one_message_and_nothing_runs(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder, marker = planted(checkpoint, tmp_path, os_system_entry_point)
    small = [arg for item in SMALL for arg in ("--set", item)]
    commands = {
        "eval": ["eval", str(folder), "--episodes", "1"],
        "export": ["export", str(folder), "--format", "onnx", "--out", str(tmp_path / "policy.onnx")],
        "rollout": ["rollout", str(SPECS / "sac.yaml"), *small, "--checkpoint", str(folder), "--episodes", "1",
                    "--out", str(tmp_path / "data.parquet")],
    }
    for name, argv in commands.items():
        assert cli.main(argv) == 2, name
        err = capsys.readouterr().err
        assert "os:system" in err and "--trust-code" in err and "Traceback" not in err, (name, err)
        assert len(err.strip().splitlines()) == 1, err
        assert not marker.exists(), name
    assert not list(tmp_path.glob("policy.onnx*")) and not list(tmp_path.glob("data.parquet*"))


def test_resume_never_imports_what_the_checkpoint_names(checkpoint: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    folder, marker = planted(checkpoint, tmp_path, os_system_entry_point)
    small = [arg for item in [*SMALL, "budget.env_steps=400", "algo.warm_up_steps=100"] for arg in ("--set", item)]
    assert cli.main(["run", str(SPECS / "sac.yaml"), *small, "--plain", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "env.entry_point" in err and "Traceback" not in err, err
    assert not marker.exists()


def test_trust_code_runs_what_the_checkpoint_names(checkpoint: Path, tmp_path: Path) -> None:
    folder, marker = planted(checkpoint, tmp_path, os_system_entry_point)
    with pytest.raises(EnvSetupError, match="must inherit from the gymnasium.Env"):  # but the command ran first
        load_policy(folder, trust_code=True)
    assert marker.exists()


def test_a_rollout_needs_no_opt_in_for_code_the_users_own_spec_names(checkpoint: Path, tmp_path: Path) -> None:
    """The user's spec names myenvs (imports, py_modules); a checkpoint naming the same is not refused
    (its pusher-reach weights then do not fit the point env: the next check speaks), one naming more is."""
    from aa_ray.rollout.job import policy_from_checkpoint

    user_envs = Path(__file__).parent / "user_envs"
    own = {"imports": ["myenvs"], "py_modules": [str(user_envs / "myenvs")]}
    users_spec = load_spec(user_envs / "point_reach.yaml", [f"env.py_modules=[{user_envs / 'myenvs'}]"])
    assert {code.field for code in named_code(spec_to_dict(users_spec))} == {"env.imports", "env.py_modules"}
    assert named_code(spec_to_dict(SPEC)) == []  # aa-ray's and gymnasium's own envs name no code
    same, _ = planted(checkpoint, tmp_path, lambda spec, marker: spec["env"].update(own, id="myenvs/PointReach-v0"))
    with pytest.raises(CheckpointError, match="does not fit env myenvs/PointReach-v0"):
        policy_from_checkpoint(users_spec, same)
    (tmp_path / "more").mkdir()
    more, marker = planted(checkpoint, tmp_path / "more", lambda spec, marker: (
        spec["env"].update(own, id="myenvs/PointReach-v0"), with_plugin(spec, marker)))
    with pytest.raises(UntrustedCodeError, match="algo.plugin 'their_pkg'"):
        policy_from_checkpoint(users_spec, more)
    assert not marker.exists()


def test_a_pickle_in_the_state_file_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = tmp_path / "theirs"
    folder.mkdir()
    with open(folder / STATE_FILE, "wb") as file:
        pickle.dump({"format_version": 5, "spec": PlantedCommand(marker)}, file)
    with pytest.raises(CheckpointError, match="corrupt or not an aa-ray checkpoint"):
        load_checkpoint(folder)
    assert not marker.exists()


def minari_folder(tmp_path: Path, metadata: object) -> Path:
    folder = tmp_path / "their_dataset"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "metadata.json").write_text(json.dumps(metadata))
    return folder


def test_a_minari_dataset_whose_metadata_would_make_an_env_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env_spec = {"id": "Their-v0", "entry_point": "os:system", "kwargs": {"command": f"touch {marker}"},
                "max_episode_steps": None, "reward_threshold": None, "nondeterministic": False,
                "disable_env_checker": True, "apply_api_compatibility": False, "additional_wrappers": []}
    folder = minari_folder(tmp_path, {"dataset_id": "their/data-v0", "env_spec": json.dumps(env_spec),
                                      "total_episodes": 1, "total_steps": 10, "data_format": "arrow"})
    with pytest.raises(DatasetError) as refused:
        read_dataset(folder)
    assert "no observation_space and no action_space" in str(refused.value) and "os:system" in str(refused.value)
    # the command line, as the report found it: validate with the folder as RLPD's prior data
    validate = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "validate", str(SPECS / "rlpd.yaml"), "--set",
         f"algo.prior_data={folder}"], capture_output=True, text=True, timeout=300,
    )
    assert validate.returncode == 2 and "Traceback" not in validate.stderr, validate.stderr[-2000:]
    assert "os:system" in validate.stderr and "algo.prior_data" in validate.stderr
    assert not marker.exists()


@pytest.mark.parametrize("metadata", [[1, 2], "text", 3])
def test_a_minari_metadata_that_is_not_an_object_is_one_message(tmp_path: Path, metadata: object) -> None:
    with pytest.raises(DatasetError, match="not the object of a Minari dataset's metadata"):
        read_dataset(minari_folder(tmp_path, metadata))


def test_a_pickled_extension_type_in_a_parquet_dataset_does_not_run(tmp_path: Path) -> None:
    """pyarrow once unpickled `arrow.py_extension_type` fields (CVE-2023-47248): no longer, and aa-ray
    reads the columns it knows as plain arrays."""
    marker = tmp_path / "ran"
    field = pa.field("obs", pa.binary(), metadata={b"ARROW:extension:name": b"arrow.py_extension_type",
                                                   b"ARROW:extension:metadata": pickle.dumps(PlantedCommand(marker))})
    pq.write_table(pa.table({"obs": pa.array([b"x"])}, schema=pa.schema([field])), tmp_path / "theirs.parquet")
    with pytest.raises(DatasetError):
        read_dataset(tmp_path / "theirs.parquet")
    assert not marker.exists()
    np.testing.assert_equal(pq.read_table(tmp_path / "theirs.parquet").column("obs").to_pylist(), [b"x"])
    assert not marker.exists()


def test_import_object_resolves_only_a_name_its_module_defines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No attribute path, no module, no callable the module merely imported: the walk out of an allowed
    module that ran `os.system` from `aa_ray.envs.source:os.system`. `__all__` makes an import the module's own."""
    from aa_ray.envs.source import EnvSourceError, import_object

    env = type("Env", (), {"py_modules": ()})()
    refused = {"aa_ray.envs.source:os.system": "not one name", "aa_ray.envs.source:os": "module 'os'",
               "aa_ray.envs.source:what_user_code_did": "defined in module 'aa_ray.errors'",
               "aa_ray.tracking.mlflow_tracker:subprocess": "module 'subprocess'"}
    for path, said in refused.items():
        with pytest.raises(EnvSourceError, match=said):
            import_object(path, "env.entry_point", env, "Env")
    from aa_ray.errors import what_user_code_did

    assert import_object("aa_ray.errors:what_user_code_did", "env.entry_point", env, "Env") is what_user_code_did
    package = tmp_path / "reexports"
    package.mkdir()
    (package / "__init__.py").write_text("from os.path import join\nfrom aa_ray.errors import clip\n"
                                         "__all__ = ['join']\nTABLE = {'a': 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_object("reexports:join", "env.mirror", env, "M") is os.path.join  # listed in __all__
    assert import_object("reexports:TABLE", "env.mirror", env, "M") == {"a": 1}  # data bound there
    with pytest.raises(EnvSourceError, match="imports rather than defines"):
        import_object("reexports:clip", "env.mirror", env, "M")


@pytest.mark.parametrize(("field", "value"), [("entry_point", b"os:system"), ("imports", [b"their_pkg"]),
                                              ("py_modules", b"/tmp/x"), ("id", b"their_pkg:X-v0"), ("mirror", 3)])
def test_a_stored_spec_naming_code_by_anything_but_a_string_is_damaged(checkpoint: Path, tmp_path: Path,
                                                                     field: str, value: object) -> None:
    folder, marker = planted(checkpoint, tmp_path, lambda spec, marker: spec["env"].update({field: value}))
    with pytest.raises(CheckpointError, match=f"damaged .* env.{field} holds {type(value).__name__}"):
        load_checkpoint(folder)
    assert not marker.exists()


def test_a_checkpoint_read_by_its_recorded_hash_is_refused_once_replaced(checkpoint: Path, tmp_path: Path) -> None:
    """What a pipeline's rollout stage does with its train stage's checkpoint: it trusts the file only
    while it has the hash the stage recorded, so a replaced one is named and nothing it names is imported."""
    from aa_ray.rollout.job import policy_from_checkpoint
    from aa_ray.tune.pipeline import file_digest

    recorded = file_digest(checkpoint / STATE_FILE)
    replaced, marker = planted(checkpoint, tmp_path, with_imports)
    with pytest.raises(CheckpointError, match="changed since it was written"):
        policy_from_checkpoint(SPEC, replaced, sha256=recorded)
    assert not marker.exists() and "their_pkg" not in sys.modules
    spec, state = policy_from_checkpoint(SPEC, checkpoint, sha256=recorded)  # the file it recorded
    assert spec.env.id == SPEC.env.id and state
