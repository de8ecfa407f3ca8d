"""What the learning tests share: a short run of a shipped spec, in this process.

The learning claims are about the algorithms, so their runs use the inline backend: the same actor
graph and plain classes as on Ray, without Ray's start-up and inter-process calls (on 2 cores a
3,000-step SAC run took 39-44 s inline against 64-71 s on Ray). For a fixed seed it repeats the Ray
backend's sync runs exactly (tests/test_inline_backend.py). Learning on Ray itself is checked by the
async SAC run of tests/test_scale_out.py, and by the suite, sweep and pipeline tests."""

from __future__ import annotations

from pathlib import Path

from aa_ray.records import RunOutcome
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
IN_PROCESS = ["tracking.enabled=false", "checkpoint.save_replay=false", "runtime.backend=inline"]
# The MLP specs' 256 x 256 networks and batch of 256, halved for CI time on 2 cores: a gradient step
# costs about a third, and every run below still reaches its threshold within its budget (the
# measured steps are in each test). The shipped widths are the ones the benchmarks time.
NARROW = ["algo.actor_hidden_dims=[128,128]", "algo.critic_hidden_dims=[128,128]", "algo.batch_size=128"]


def train(spec_file: str, *overrides: str) -> RunOutcome:
    """Run `specs/<spec_file>` with `overrides` inline, untracked; the trainer's result."""
    return Trainer(load_spec(SPECS / spec_file, [*IN_PROCESS, *overrides]), live=False).run()
