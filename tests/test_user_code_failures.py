"""The user's own code failing where aa-ray calls it (a module imported for the env or an algorithm
plugin, an env constructor, a mirror function) is one message naming the spec field, exit code 2,
never a traceback; and a `sys.exit(0)` in that code no longer ends `validate` or `run` as a
success with no word."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from aa_ray import cli

SPEC = """
name: users_code
env: {{id: aa_ray/PusherReach-v0, py_modules: [{package}]}}
algo: {{name: sac, warm_up_steps: 200, actor_hidden_dims: [32, 32], critic_hidden_dims: [32, 32]}}
budget: {{env_steps: 400}}
runners: {{num_runners: 1, envs_per_runner: 1}}
tracking: {{enabled: false}}
runtime: {{backend: inline}}
"""

PACKAGE = '''
import sys

import gymnasium as gym


def raising_mirror():
    raise RuntimeError("the mirror broke")


NOT_A_MIRROR = 42


def exiting_env(**kwargs):
    sys.exit(0)
'''


@pytest.fixture
def users_package(tmp_path: Path) -> tuple[Path, str]:
    """(a spec naming a package of the user's, the package's name): a name of its own per test, so no
    test finds another's module already imported."""
    name = f"users_{uuid.uuid4().hex[:12]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text(PACKAGE)
    (package / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    (package / "raises_on_import.py").write_text("raise RuntimeError('the plugin broke at import')\n")
    (tmp_path / "spec.yaml").write_text(SPEC.format(package=package))
    return tmp_path / "spec.yaml", name


def refused(argv: list[str], capsys: pytest.CaptureFixture, *expected: str) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


def test_an_env_module_that_exits_at_import_is_an_error_not_a_silent_success(users_package: tuple[Path, str]) -> None:
    spec_file, name = users_package
    for command in ("validate", "run"):
        done = subprocess.run([sys.executable, "-m", "aa_ray.cli", command, str(spec_file), "--set",
                               f"env.imports=[{name}.exits_on_import]"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, (command, done.stdout[-2000:], done.stderr[-2000:])
        assert "env.imports" in done.stderr and "called sys.exit(0)" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


CASES = {
    "env constructor exits": ("env.entry_point={name}:exiting_env", "its constructor called sys.exit(0)"),
    "mirror raises": ("env.mirror={name}:raising_mirror", "calling it raised RuntimeError: the mirror broke"),
    "mirror is a number": ("env.mirror={name}:NOT_A_MIRROR", "is not a mirror"),
    "plugin raises at import": ("algo.plugin={name}.raises_on_import", "raised RuntimeError: the plugin broke"),
    "plugin exits at import": ("algo.plugin={name}.exits_on_import", "called sys.exit(0)"),
}


@pytest.mark.parametrize(("override", "expected"), CASES.values(), ids=CASES.keys())
def test_the_users_code_failing_is_one_message(users_package: tuple[Path, str], capsys: pytest.CaptureFixture,
                                               override: str, expected: str) -> None:
    spec_file, name = users_package
    extra = ["--set", "algo.name=users_algo"] if override.startswith("algo.plugin") else []
    field = override.split("=")[0]
    refused(["validate", str(spec_file), "--set", override.format(name=name), *extra], capsys,
            expected, field if field != "env.entry_point" else "env")
