"""The replay-to-learner path in one process: the replay buffer drawing a learner iteration's
sample (32 batches, as at train_every 32 and UTD 1) and the learner's update on it with the timed
learner of `benchmarks/scale_sim` at zero cost (so what is timed is the data handling: gathering the
rows, turning them into tensors, splitting them per fleet step). Run it under two trees to compare
code versions side by side (alternate them; the ratio is what to read):

    for tree in /path/to/old /path/to/new /path/to/old /path/to/new; do
        PYTHONPATH=$tree .venv/bin/python benchmarks/bench_replay_path.py; done
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from _common import add_smoke, random_transitions  # noqa: E402

import aa_ray  # noqa: E402
from aa_ray.records import ObsDims  # noqa: E402
from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402


def best_ms(call, reps: int = 5) -> float:  # noqa: ANN001
    call()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_smoke(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # the spec names its env package relative to the repository root: given absolutely, any folder runs it
    spec = load_spec(BENCHMARKS / "scale_sim.yaml", [f"env.py_modules=[{BENCHMARKS / 'scale_sim'}]"])
    rows, chunks, batches = (50_000, 1, (256,)) if args.smoke else (1_000_000, 5, (256, 8192))
    replay = ReplayBuffer(rows, 17, 6, seed=0)
    for _ in range(chunks):
        replay.add(random_transitions(rows // chunks, 17, 6))
    learner = Learner(spec, ObsDims.of(17), 6, 0)
    print(f"# aa_ray from {Path(aa_ray.__file__).parent}")
    for batch in batches:
        sample = replay.sample_for_learners(32, batch, 1)
        sample_ms = best_ms(lambda b=batch: replay.sample_for_learners(32, b, 1))
        update_ms = best_ms(lambda s=sample: learner.update([], s))
        print(f"batch {batch:>4} x 32: replay sample {sample_ms:7.2f} ms   learner update (data handling) "
              f"{update_ms:7.2f} ms")


if __name__ == "__main__":
    main()
