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

import copy
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos import config, soft_updates
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.knobs import GradientStep, LinearLRSchedule, RewardNormalizer, every_group, fused_adam, make_optimizer
from aa_ray.nets.mlp import EnsembleQ, MLPActor, MLPValue
from aa_ray.nets.policy import ObsDims, SquashedGaussianPolicy
from aa_ray.records import Batch


class SACConfig(
    config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs, config.BEEKnobs, config.RLPDKnobs,
    config.MLPNetworks
):
    name: Literal["sac"] = "sac"


def make_policy(cfg: SACConfig, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs.actor, act_dim, cfg.actor_hidden_dims), obs, cfg.normalize_obs)


class SAC(Bookkeeping):
    def __init__(self, cfg: SACConfig, obs: ObsDims, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg = cfg
        self.policy = make_policy(cfg, obs, act_dim).to(device)
        self.critic = EnsembleQ(obs.full, act_dim, cfg.critic_hidden_dims, 2, layer_norm=cfg.layer_norm).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = MLPValue(obs.full, cfg.critic_hidden_dims).to(device) if cfg.learn_v else None
        self.log_alpha, self.target_entropy = soft_updates.temperature(cfg, act_dim, device)
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(device)

        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.actor_lr))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.critic_lr))
        self.alpha_step = step(fused_adam([self.log_alpha], cfg.alpha_lr), average_grads=True)
        self.value_step = step(make_optimizer(self.value, cfg.optimizer, cfg.critic_lr)) if self.value else None
        steps = (self.actor_step, self.critic_step, self.alpha_step, self.value_step)
        self.schedule = LinearLRSchedule(every_group(*steps), cfg.lr_end_fraction, planned_steps)
        self.largest_value = torch.zeros(())

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp = ddp.wrap(self.policy)
        self.critics = soft_updates.Critics(
            self.critic, ddp.wrap(self.critic), self.critic_target, self.critic_step,
            self.value, ddp.wrap(self.value) if self.value else None, self.value_step,
        )

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic (and V) steps, then the actor and temperature on the
        last batch."""
        alpha = self.log_alpha.detach().exp()
        for i in range(batch.num_batches):
            x = soft_updates.prepare(batch.at(i), self.policy, self.reward_norm)
            info, q = soft_updates.update_scalar_critics(
                x, alpha, self.policy, self.critics, self.reward_norm.scale(), self.cfg
            )
        info |= soft_updates.update_actor_and_temperature(
            batch.at(-1).obs, self.policy, self.policy_ddp, self.critic, lambda q: q, self.actor_step,
            self.log_alpha, self.alpha_step, self.target_entropy, self.cfg,
        )
        self.largest_value = q.abs().max()
        info[m.ACTOR_LR] = self.schedule.current_lr()
        self.schedule.advance()
        return info

    def parts(self) -> dict[str, Any]:
        parts = {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
            "alpha_step": self.alpha_step, "log_alpha": self.log_alpha,
        }
        if self.value is not None:
            parts |= {"value": self.value, "value_step": self.value_step}
        return parts | {"steps_done": self.schedule}
