"""`runtime.backend: inline`: the actor graph's plain classes in the driver's process. For a fixed
seed it repeats the Ray backend's sync mode exactly, it runs where neither Ray nor MLflow can be
imported, the spec refuses what it cannot do, and an actor's exception ends the run clearly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from aa_ray.errors import SpecError
from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.runtime.remote import TrainingError
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
PENDULUM = ROOT / "specs" / "sac_pendulum.yaml"
# two runners (their calls interleave with the learner's and the replay's), evaluated twice
TINY = [
    "budget.env_steps=800", "algo.warm_up_steps=200", "algo.train_every=8", "algo.batch_size=32",
    "algo.actor_hidden_dims=[16,16]", "algo.critic_hidden_dims=[16,16]", "runners.num_runners=2",
    "eval.every_env_steps=400", "eval.episodes=1", "checkpoint.every_env_steps=100000", "tracking.enabled=false",
]


def tensors(tree: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested state, by its path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {path: t for key, value in tree.items() for path, t in tensors(value, f"{prefix}/{key}").items()}
    if isinstance(tree, list | tuple):
        return {path: t for i, value in enumerate(tree) for path, t in tensors(value, f"{prefix}/{i}").items()}
    return {}


def test_inline_repeats_the_ray_backends_sync_run_exactly(tmp_path: Path) -> None:
    """The Ray side calls its two runners through a fleet actor (`runtime.fleet_actor_from=2`), a hop
    the inline side does not have: the runners still see the same calls in the same order."""
    ray_side = ["runtime.backend=ray", "runtime.fleet_actor_from=2"]
    results = {
        backend: Trainer(load_spec(PENDULUM, [*TINY, *overrides]), run_dir=tmp_path / backend, live=False).run()
        for backend, overrides in (("inline", ["runtime.backend=inline"]), ("ray", ray_side))
    }
    inline, ray = results["inline"], results["ray"]
    assert len(inline.evals) == 2 and inline.evals == ray.evals
    assert (inline.env_steps, inline.replay_size) == (ray.env_steps, ray.replay_size)
    learner = {backend: tensors(load_checkpoint(run.checkpoint).learner) for backend, run in results.items()}
    assert learner["inline"].keys() == learner["ray"].keys()
    differing = [path for path, t in learner["inline"].items() if not torch.equal(t, learner["ray"][path])]
    assert not differing, f"learner state differs between the backends at {differing}"


WITHOUT_RAY_AND_MLFLOW = textwrap.dedent(
    """
    import importlib.abc
    import sys

    attempts = []

    class Unimportable(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("ray", "mlflow"):
                attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)")
            return None

    sys.meta_path.insert(0, Unimportable())

    from aa_ray.cli import main

    code = main(["run", sys.argv[1], "--plain", *sys.argv[2:]])
    assert code == 0, code
    assert not attempts, f"tried to import {attempts}"
    print("inline run without ray and mlflow")
    """
)


def test_an_inline_run_completes_where_ray_and_mlflow_cannot_be_imported(tmp_path: Path) -> None:
    small = [*TINY, "budget.env_steps=400", "runners.num_runners=1", "runtime.backend=inline", "runtime.output_dir=out"]
    command = [sys.executable, "-c", WITHOUT_RAY_AND_MLFLOW, str(PENDULUM), *(a for s in small for a in ("--set", s))]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "inline run without ray and mlflow" in result.stdout
    assert "env_steps" in result.stderr and "done (budget)" in result.stderr  # the progress lines, as usual
    (final,) = tmp_path.glob("out/*/checkpoints/final")
    assert load_checkpoint(final).driver.counters.env_steps >= 400


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["runtime.mode=async"], ["runtime.backend inline", "runtime.mode: sync", "runtime.backend: ray"]),
        (["learners.num_learners=2"], ["runtime.backend inline", "learners.num_learners is 2",
                                       "learners.num_learners: 1", "runtime.backend: ray"]),
    ],
)
def test_the_spec_refuses_what_inline_cannot_run(overrides: list[str], named: list[str]) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(PENDULUM, ["runtime.backend=inline", *overrides])
    assert all(part in str(refused.value) for part in named), str(refused.value)


def test_an_inline_runners_exception_ends_the_run_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken_env(self: EnvRunner, num_steps: int, random_actions: bool, *weights: object) -> None:
        raise ValueError("the env broke")

    monkeypatch.setattr(EnvRunner, "sample", broken_env)
    spec = load_spec(PENDULUM, [*TINY, "runtime.backend=inline"])
    expected = "EnvRunner.sample raised ValueError: the env broke.*restarts no actor"
    with pytest.raises(TrainingError, match=expected) as err:
        Trainer(spec, run_dir=tmp_path / "run", live=False).run()
    assert isinstance(err.value.__cause__, ValueError)  # the runner's own traceback comes with it
