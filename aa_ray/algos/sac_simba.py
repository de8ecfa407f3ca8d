"""SAC with SimbaV2 actor and critics (scalar twin critics); optional BAC/BEE.

Reference: Lee et al. 2025, "Hyperspherical Normalization for Scalable Deep Reinforcement
Learning" (SimbaV2, arXiv 2502.15280) and its official code (dojeon-ai/SimbaV2). Taken from there:
hyperspherical bias-free layers with weights re-projected to the unit sphere after every
optimizer step, running observation normalization, Adam without weight decay with the learning
rate decayed linearly from 1e-4 to 5e-5, initial temperature 0.01, target entropy -|A|/2, and
the update order actor -> temperature -> critic -> target. The paper's critic is distributional;
this variant keeps a scalar critic (the distributional one is `sac_dist_simba`). BEE as in `sac`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from aa_ray.algos import config, sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.nets.simba import SimbaV2Critic, SimbaV2Value, normalize_weights_
from aa_ray.records import Batch, ObsDims


class SACSimbaConfig(
    config.SimbaV2Recipe, config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs,
    config.BEEKnobs, config.RLPDKnobs, config.SimbaV2Networks
):
    name: Literal["sac_simba"] = "sac_simba"


make_policy = sac_family.simba_policy  # the acting module env runners load


class SACSimba(Bookkeeping):
    def __init__(self, cfg: SACSimbaConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        # every step of a hyperspherical network ends with its weights projected back onto the sphere
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim),
            critic=SimbaV2Critic(obs.full, act_dim, cfg.critic_hidden_dim, cfg.critic_num_blocks),
            value=SimbaV2Value(obs.full, cfg.critic_hidden_dim, cfg.critic_num_blocks) if cfg.learn_v else None,
            reward_norm=RewardNormalizer(cfg.normalize_reward), project=normalize_weights_,
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """SimbaV2's order: actor and temperature on the first batch, then `batch.num_batches` critic (and V)
        steps, each followed by the target update; then the learning rates move along their decay."""
        info, self.largest_value = sac_family.fleet_step(self.agent, batch, order="actor_then_critics")
        return info

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()
