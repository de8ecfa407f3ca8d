"""`learners.compile`: a compiled learner trains like the eager one to float tolerance, and a
machine where compiling fails trains eagerly, from exactly the state it had, saying so once."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import random_transitions  # noqa: E402

from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
OBS_DIM, ACT_DIM = 5, 2
SMALL = ["algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]", "algo.train_every=2", "algo.utd_ratio=2",
         "algo.batch_size=32"]


def train(compile_setting: str) -> tuple[Learner, dict[str, float]]:
    replay = ReplayBuffer(1000, OBS_DIM, ACT_DIM, seed=0)
    replay.add(random_transitions(1000, OBS_DIM, ACT_DIM))
    learner = Learner(load_spec(SPECS / "sac.yaml", [*SMALL, f"learners.compile={compile_setting}"]), OBS_DIM, ACT_DIM)
    for _ in range(3):
        info = learner.update([], replay.sample(4, 32)).metrics
    return learner, info


def test_compiled_sac_matches_eager() -> None:
    eager, eager_info = train("off")
    compiled, info = train("on")
    assert (eager_info["learner/compiled"], info["learner/compiled"]) == (0.0, 1.0)
    assert torch.allclose(compiled.parameters_vector(), eager.parameters_vector(), atol=1e-5)
    assert info["critic/q_loss"] == pytest.approx(eager_info["critic/q_loss"], rel=1e-4)


def test_a_failing_compiler_falls_back_to_eager_from_the_same_state(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(graph: torch.fx.GraphModule, inputs: list) -> None:
        raise RuntimeError("no C++ compiler on this machine")

    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **_: compile_module(self, backend=no_compiler))
    with caplog.at_level(logging.WARNING, logger="aa_ray.runtime.learner"):
        fallen_back, info = train("on")
    eager, _ = train("off")
    assert info["learner/compiled"] == 0.0
    assert torch.equal(fallen_back.parameters_vector(), eager.parameters_vector())  # bit-exact: nothing half-applied
    warnings = [r.getMessage() for r in caplog.records if "learners.compile" in r.getMessage()]
    assert len(warnings) == 1 and "no C++ compiler on this machine" in warnings[0]


def test_auto_compiles_on_cuda_only() -> None:
    from aa_ray.runtime.learner import compiles

    spec = load_spec(SPECS / "sac.yaml", ["learners.compile=auto"])
    assert compiles(spec, torch.device("cuda")) and not compiles(spec, torch.device("cpu"))
    assert load_spec(SPECS / "sac.yaml", ["learners.compile=off"]).learners.compile == "off"  # not YAML's false
