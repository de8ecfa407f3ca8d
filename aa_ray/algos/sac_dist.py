"""Distributional SAC: twin categorical (C51) critics and an automatically tuned temperature.

References: Bellemare et al. 2017, "A Distributional Perspective on Reinforcement Learning"
(C51: fixed support, projected target, cross-entropy loss); Haarnoja et al. 2018 (SAC);
SimbaV2 (Lee et al. 2025) and FastTD3 (Seo et al. 2025) for the distributional clipped double-Q.
Deliberate choices:
- clipped double-Q on distributions: per sample, the target critic whose distribution has the
  lower mean is the one projected (a min over atoms would not be a distribution);
- the soft term is folded into the atoms, target = r + bootstrap * (z_j - alpha log pi(a'|s'));
- the actor maximises min over the two critics of the expected Q, E[Z] = sum_j p_j z_j;
- `critic_loss` (mse / huber) does not apply: the critics are trained by cross-entropy;
- with `normalize_reward`, rewards are scaled by max(std(G), max|G| / min(-v_min, v_max)) as in SimbaV2;
- otherwise the same shape as `sac`: actor and temperature once per fleet step on the last batch
  of the stack, critics `utd_ratio` times.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from aa_ray.algos import config, sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.contract import TrainingSetup
from aa_ray.nets.distributional import EnsembleCategoricalQ, make_support
from aa_ray.records import Batch, ObsDims


class SACDistConfig(
    config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs, config.C51Support,
    config.RLPDKnobs, config.MLPNetworks
):
    name: Literal["sac_dist"] = "sac_dist"


make_policy = sac_family.mlp_policy  # the acting module env runners load


class SACDist(Bookkeeping):
    def __init__(self, cfg: SACDistConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim),
            critic=EnsembleCategoricalQ(
                obs.full, act_dim, cfg.critic_hidden_dims, cfg.num_atoms, num_critics=2, layer_norm=cfg.layer_norm
            ),
            reward_norm=sac_family.support_reward_normalizer(cfg, cfg.normalize_reward),
            support=make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, setup.device),
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic steps, then the actor (on the critics' expected Q) and
        the temperature on the last batch."""
        info, self.largest_value = sac_family.fleet_step(self.agent, batch, order="critics_then_actor")
        return info

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()
