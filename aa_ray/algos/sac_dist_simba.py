"""SAC with SimbaV2 networks and twin categorical (C51) critics: the SimbaV2 paper's agent.

Reference: Lee et al. 2025, "Hyperspherical Normalization for Scalable Deep Reinforcement
Learning" (SimbaV2, arXiv 2502.15280) and its official code (dojeon-ai/SimbaV2); Bellemare et al.
2017 (C51). Taken from SimbaV2: hyperspherical bias-free layers re-projected to the unit sphere
after every optimizer step, a critic predicting logits over 101 atoms on [-5, 5] trained by
cross-entropy, the soft term folded into the atoms (r + bootstrap * (z_j - alpha log pi)),
clipped double-Q as "project the target critic with the lower mean", rewards scaled by
max(std(G), max|G| / 5) from running discounted returns G, Adam without weight decay with the
learning rate decayed linearly from 1e-4 to 5e-5, initial temperature 0.01, target entropy
-|A|/2, and the update order actor -> temperature -> critic -> target.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from aa_ray.algos import config, sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.contract import TrainingSetup
from aa_ray.nets.distributional import SimbaV2CategoricalCritic, make_support
from aa_ray.nets.simba import normalize_weights_
from aa_ray.records import Batch, ObsDims


class SACDistSimbaConfig(
    config.SimbaV2Recipe, config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs,
    config.C51Support, config.RLPDKnobs, config.SimbaV2Networks
):
    name: Literal["sac_dist_simba"] = "sac_dist_simba"
    normalize_reward: bool = Field(True, description="scale rewards so running returns fit the support")
    v_min: float = Field(-5.0, description="lowest atom (soft return, in scaled reward units)")
    v_max: float = Field(5.0, description="highest atom; the reward scaling maps max|G| to min(-v_min, v_max)")


make_policy = sac_family.simba_policy  # the acting module env runners load


class SACDistSimba(Bookkeeping):
    def __init__(self, cfg: SACDistSimbaConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        # every step of a hyperspherical network ends with its weights projected back onto the sphere
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim),
            critic=SimbaV2CategoricalCritic(
                obs.full, act_dim, cfg.critic_hidden_dim, cfg.critic_num_blocks, cfg.num_atoms
            ),
            reward_norm=sac_family.support_reward_normalizer(cfg, cfg.normalize_reward), project=normalize_weights_,
            support=make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, setup.device),
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """SimbaV2's order: actor (on the critics' expected Q) and temperature on the first batch, then
        `batch.num_batches` critic steps, each followed by the target update; then the lrs decay a step."""
        info, self.largest_value = sac_family.fleet_step(self.agent, batch, order="actor_then_critics")
        return info

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()
