"""DroQ: SAC whose critics carry dropout and layer normalization, at a high update-to-data ratio.

Reference: Hiraoka et al. 2022, "Dropout Q-Functions for Doubly Efficient Reinforcement Learning"
(ICLR 2022); sbx's DroQ for the defaults. What differs from SAC is the critic ensemble and the
knobs, so the update is SAC's own (`sac_family.fleet_step`, critics then actor):
- each hidden layer of each critic is Linear -> Dropout(0.01) -> LayerNorm -> ReLU, and dropout
  is on in every critic forward the learner makes, the slow target's included (the learner trains
  in training mode; env runners never run a critic);
- 20 critic updates per env step (`utd_ratio: 20`), the actor and temperature once per fleet step;
- two critics (the paper's ensemble of M = 2) with the clipped double-Q target, lr 3e-4 throughout.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt
from torch import Tensor

from aa_ray.algos import config, sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.nets.mlp import EnsembleQ, SeededDropout
from aa_ray.records import Batch, ObsDims


class DroQConfig(
    config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs, config.RLPDKnobs, config.MLPNetworks
):
    name: Literal["droq"] = "droq"
    utd_ratio: PositiveInt = Field(20, description="critic updates per fleet step")
    critic_lr: PositiveFloat = Field(3e-4, description="critic learning rate")
    alpha_lr: PositiveFloat = Field(3e-4, description="temperature learning rate")
    layer_norm: bool = Field(True, description="LayerNorm after each hidden critic layer (after the dropout)")
    dropout_rate: float = Field(0.01, gt=0, lt=1, description="dropout probability of each hidden critic unit")


make_policy = sac_family.mlp_policy  # the acting module env runners load


class DroQ(Bookkeeping):
    def __init__(self, cfg: DroQConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        critic = EnsembleQ(
            obs.full, act_dim, cfg.critic_hidden_dims, 2, layer_norm=cfg.layer_norm,
            dropout=SeededDropout(cfg.dropout_rate, setup.generator),
        )
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim), critic=critic,
            reward_norm=RewardNormalizer(cfg.normalize_reward),
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` (utd_ratio) critic steps, then the actor and temperature on
        the last batch."""
        info, self.largest_value = sac_family.fleet_step(self.agent, batch, order="critics_then_actor")
        return info

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()
