"""`runtime.mode: device` through the trainer: a resumed run repeats the uninterrupted one, and two
device learners (two processes, one DDP group over gloo) train a run on Ray to its end."""

from __future__ import annotations

from pathlib import Path

import torch

from aa_ray.runtime.checkpoint import load_checkpoint
from aa_ray.runtime.trainer import Trainer
from aa_ray.spec.loader import load_spec

SPEC = Path(__file__).resolve().parents[1] / "specs" / "sac_point_reach.yaml"
SMALL = [
    "runtime.mode=device", "runners.envs_per_runner=16", "algo.actor_hidden_dims=[16]",
    "algo.critic_hidden_dims=[16]", "algo.batch_size=32", "algo.warm_up_steps=64", "algo.train_every=2",
    "algo.n_step=3", "budget.env_steps=384", "eval.every_env_steps=192", "eval.episodes=4",
    "checkpoint.every_env_steps=192", "tracking.enabled=false", "env.max_episode_steps=7", "budget.stop_at=null",
]


def flat(tree: object) -> torch.Tensor:
    def leaves(node: object) -> list[torch.Tensor]:
        if isinstance(node, torch.Tensor):
            return [node.reshape(-1).double()]
        if isinstance(node, dict):
            return [t for key in sorted(node, key=str) for t in leaves(node[key])]
        if isinstance(node, list | tuple):
            return [t for item in node for t in leaves(item)]
        return []

    return torch.cat(leaves(tree))


def test_a_resumed_device_run_repeats_the_uninterrupted_one(tmp_path: Path) -> None:
    spec = load_spec(SPEC, [*SMALL, "runtime.backend=inline"])
    whole = Trainer(spec, run_dir=tmp_path / "whole", live=False).run()
    (midway,) = (tmp_path / "whole" / "checkpoints").glob("step_*192*")
    saved = load_checkpoint(midway)
    assert saved.runners[0]["replay"] is not None  # the ring travels with the checkpoint (save_replay)
    resumed = Trainer(spec, run_dir=tmp_path / "resumed", resume=saved, live=False).run()
    assert resumed.env_steps == whole.env_steps and resumed.evals[-1] == whole.evals[-1]
    finals = [load_checkpoint(run.checkpoint) for run in (whole, resumed)]
    assert torch.equal(flat(finals[0].learner), flat(finals[1].learner))


def test_two_device_learners_train_a_run_on_ray(tmp_path: Path) -> None:
    spec = load_spec(SPEC, [*SMALL, "learners.num_learners=2", "runners.num_runners=2", "runtime.backend=ray",
                            "algo.batch_size=64"])
    assert [bundle for bundle in spec.bundles()] == [{"CPU": 1.0}, {"CPU": 1.0}]  # no runner or replay bundles
    result = Trainer(spec, run_dir=tmp_path / "run", live=False).run()
    assert result.env_steps >= 384 and len(result.evals) == 2
    final = load_checkpoint(result.checkpoint)
    assert len(final.runners) == 2  # each learner process's envs and ring
