"""An algorithm plugin whose update costs a set time and learns nothing: a stand-in for a fast GPU
learner, so the harness can ask whether the runtime keeps such a learner fed.

The default time per gradient update, 1.4 ms, comes from LeanRL's published SAC figure
(`sac_continuous_action_torchcompile.py` with torch.compile and CUDA graphs, one H100, HalfCheetah:
725 env steps/s at one update per env step, so at most 1/725 s = 1.38 ms per update, env step
included). That was at batch 256; a 256-wide SAC update at batch 8192 is about 16 GFLOP, a fraction
of a millisecond of an H100, so the update stays bound by kernel launches and we keep 1.4 ms for
batch 8192 too (an assumption, stated where the results are).

The update sleeps, as a host waits for its GPU: the learner's process holds no CPU meanwhile.
Acting is real (a small tanh-Gaussian MLP policy in every env runner), so runners pay for
inference and weight loads as they would.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
from pydantic import Field, NonNegativeFloat
from torch import Tensor

from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.config import MLPNetworks, OffPolicyKnobs
from aa_ray.algos.contract import Health, TrainingSetup
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.registry import Registered
from aa_ray.nets.mlp import MLPActor
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.records import Batch, ObsDims

LEANRL_H100_SAC_UPDATE_S = 1.4e-3


class TimedLearnerConfig(OffPolicyKnobs, MLPNetworks):
    name: Literal["timed_learner"] = "timed_learner"
    update_s: NonNegativeFloat = Field(
        LEANRL_H100_SAC_UPDATE_S,
        description="seconds one gradient update takes (slept, as a host waits on its GPU); 0: a free learner",
    )


def make_policy(cfg: TimedLearnerConfig, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs.actor, act_dim, cfg.actor_hidden_dims), obs, cfg.normalize_obs)


class TimedLearner(Bookkeeping):
    def __init__(self, cfg: TimedLearnerConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        self.update_s = cfg.update_s
        self.policy = make_policy(cfg, obs, act_dim).to(setup.device)
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(setup.device)
        self.largest_value = torch.zeros((), device=setup.device)
        self.updates = torch.zeros((), dtype=torch.int64)  # a checkpoint holds how far it got

    def update(self, batch: Batch) -> dict[str, Tensor]:
        if self.update_s > 0:  # a free learner makes no call: `sleep(0)` alone costs ~23 us of CPU (RESULTS 44)
            time.sleep(self.update_s * batch.num_batches)
        self.updates += batch.num_batches
        return {"learner/simulated_updates": self.updates.clone(), "critic/q_loss": batch.reward.mean()}

    def health(self) -> Health:
        zero = torch.zeros((), dtype=torch.int64)
        return Health(skipped_updates=zero, consecutive_skips=zero, largest_value=self.largest_value)

    def parts(self) -> dict[str, Any]:
        return {"policy": self.policy, "reward_norm": self.reward_norm, "updates": self.updates}


ALGORITHM = Registered(TimedLearnerConfig, TimedLearner, make_policy)
