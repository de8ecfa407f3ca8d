"""The learner's core is a plain class: it imports and trains where Ray is not installed (the
lent GPU machines have torch but no Ray)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class NoRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)")
            return None

    sys.meta_path.insert(0, NoRay())

    import numpy as np

    from aa_ray.runtime.learner import Learner
    from aa_ray.spec.loader import load_spec

    spec = load_spec("specs/sac.yaml", [
        "algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]", "algo.batch_size=8",
        "algo.utd_ratio=2", "tracking.enabled=false",
    ])
    learner = Learner(spec, obs_dim=4, act_dim=2)
    before, _ = learner.policy_state()
    rng = np.random.default_rng(0)
    shape = (2 * 3, 8)
    samples = {
        "obs": rng.normal(size=(*shape, 4)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(*shape, 2)).astype(np.float32),
        "reward": rng.normal(size=shape).astype(np.float32),
        "next_obs": rng.normal(size=(*shape, 4)).astype(np.float32),
        "terminated": np.zeros(shape, np.float32),
        "truncated": np.zeros(shape, np.float32),
        "discount": np.full(shape, 0.99, np.float32),
    }
    stats = {"obs": (8, np.zeros(4), np.ones(4)), "return": (8, 0.0, 1.0, 1.0)}
    info = learner.update(samples, [stats])
    assert "ray" not in sys.modules
    assert info["learner/critic_updates"] == 6.0, info
    assert np.isfinite(info["critic/q_loss"]), info
    after, version = learner.policy_state()
    assert version == 1
    assert any((after[name] != before[name]).any() for name in before), "the update changed no policy weight"
    print("trained without ray")
    """
)


def test_a_learner_updates_where_ray_cannot_be_imported() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained without ray" in result.stdout
