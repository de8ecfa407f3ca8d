"""Soft Actor-Critic with twin critics and an automatically tuned temperature; optional BAC/BEE.

References: Haarnoja et al. 2018, "Soft Actor-Critic" (arXiv 1801.01290) and "Soft Actor-Critic
Algorithms and Applications" (arXiv 1812.05905) for the temperature loss; CleanRL's
`sac_continuous_action.py` for the single-file shape; Ji et al. 2024, "Seizing Serendipity:
Exploiting the Value of Past Success in Off-Policy Actor-Critic" (BAC, the BEE operator).
Deliberate choices:
- the two critics are one batched ensemble (one matmul per layer for both);
- the actor and temperature update once per fleet step on the last batch of the stack, the
  critics `utd_ratio` times (see README, "UTD ratio");
- BEE (`bee_lambda > 0`) mixes an exploitation target r + gamma V(s'), where V is an expectile of
  replayed actions' values, into the usual soft target.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from aa_ray.algos import config, sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.nets.mlp import EnsembleQ, MLPValue
from aa_ray.records import Batch, ObsDims


class SACConfig(
    config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs, config.BEEKnobs, config.RLPDKnobs,
    config.MLPNetworks
):
    name: Literal["sac"] = "sac"


make_policy = sac_family.mlp_policy  # the acting module env runners load


class SAC(Bookkeeping):
    def __init__(self, cfg: SACConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim),
            critic=EnsembleQ(obs.full, act_dim, cfg.critic_hidden_dims, 2, layer_norm=cfg.layer_norm),
            value=MLPValue(obs.full, cfg.critic_hidden_dims) if cfg.learn_v else None,
            reward_norm=RewardNormalizer(cfg.normalize_reward),
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic (and V) steps, then the actor and temperature on the
        last batch."""
        info, self.largest_value = sac_family.fleet_step(self.agent, batch, order="critics_then_actor")
        return info

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()
