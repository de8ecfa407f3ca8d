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

import copy
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos import config, soft_updates
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.knobs import GradientStep, LinearLRSchedule, every_group, fused_adam, make_optimizer
from aa_ray.nets.distributional import EnsembleCategoricalQ, expected_value, make_support
from aa_ray.nets.mlp import MLPActor
from aa_ray.nets.policy import ObsDims, SquashedGaussianPolicy
from aa_ray.records import Batch


class SACDistConfig(
    config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs, config.C51Support,
    config.RLPDKnobs, config.MLPNetworks
):
    name: Literal["sac_dist"] = "sac_dist"


def make_policy(cfg: SACDistConfig, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs.actor, act_dim, cfg.actor_hidden_dims), obs, cfg.normalize_obs)


class SACDist(Bookkeeping):
    def __init__(self, cfg: SACDistConfig, obs: ObsDims, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg = cfg
        self.policy = make_policy(cfg, obs, act_dim).to(device)
        self.critic = EnsembleCategoricalQ(
            obs.full, act_dim, cfg.critic_hidden_dims, cfg.num_atoms, num_critics=2, layer_norm=cfg.layer_norm
        ).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, device)
        self.log_alpha, self.target_entropy = soft_updates.temperature(cfg, act_dim, device)
        self.reward_norm = soft_updates.support_reward_normalizer(cfg, cfg.normalize_reward).to(device)

        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.actor_lr))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.critic_lr))
        self.alpha_step = step(fused_adam([self.log_alpha], cfg.alpha_lr), average_grads=True)
        groups = every_group(self.actor_step, self.critic_step, self.alpha_step)
        self.schedule = LinearLRSchedule(groups, cfg.lr_end_fraction, planned_steps)
        self.largest_value = torch.zeros(())

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp = ddp.wrap(self.policy)
        self.critics = soft_updates.Critics(self.critic, ddp.wrap(self.critic), self.critic_target, self.critic_step)

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic steps, then the actor (on the critics' expected Q) and
        the temperature on the last batch."""
        alpha = self.log_alpha.detach().exp()
        for i in range(batch.num_batches):
            x = soft_updates.prepare(batch.at(i), self.policy, self.reward_norm)
            info, q = soft_updates.update_categorical_critics(
                x, alpha, self.policy, self.critics, self.support, self.reward_norm.scale(), self.cfg
            )
        info |= soft_updates.update_actor_and_temperature(
            batch.at(-1).obs, self.policy, self.policy_ddp, self.critic, partial(expected_value, support=self.support),
            self.actor_step, self.log_alpha, self.alpha_step, self.target_entropy, self.cfg,
        )
        self.largest_value = q.abs().max()
        info[m.ACTOR_LR] = self.schedule.current_lr()
        self.schedule.advance()
        return info

    def parts(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
            "alpha_step": self.alpha_step, "log_alpha": self.log_alpha, "steps_done": self.schedule,
        }
