"""SAC with a fixed entropy temperature: a user's own algorithm, written against aa-ray's public
pieces (config mixins, networks, losses, gradient steps, `Bookkeeping`) in a module of its own.

The update, in the order of the math: the twin critics regress on
r + gamma^k (1 - terminated) (min Q'(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s'); the targets
follow by polyak averaging; the actor minimizes E[alpha log pi(a|s) - min Q(s, a)] on the last batch.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from pydantic import Field, PositiveFloat
from torch import Tensor

from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.config import LearningRates, MLPNetworks, OffPolicyKnobs
from aa_ray.algos.contexts import frozen
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.gradient_step import GradientStep, polyak_update_
from aa_ray.algos.losses import bootstrap_factor, sac_actor_loss, soft_td_target, td_loss
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.optimizers import fused_adam
from aa_ray.algos.registry import Registered
from aa_ray.nets.mlp import EnsembleQ, MLPActor
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.records import Batch, ObsDims


class FixedAlphaSACConfig(OffPolicyKnobs, LearningRates, MLPNetworks):
    name: Literal["fixed_alpha_sac"] = "fixed_alpha_sac"
    alpha: PositiveFloat = Field(0.05, description="the entropy temperature, never tuned")


def make_policy(cfg: FixedAlphaSACConfig, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs.actor, act_dim, cfg.actor_hidden_dims), obs, cfg.normalize_obs)


class FixedAlphaSAC(Bookkeeping):
    def __init__(self, cfg: FixedAlphaSACConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        self.cfg, self.generator, device = cfg, setup.generator, setup.device
        self.policy = make_policy(cfg, obs, act_dim).to(device)
        self.critic = EnsembleQ(obs.full, act_dim, cfg.critic_hidden_dims, 2).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(device)
        self.alpha = torch.tensor(cfg.alpha, device=device)
        self.actor_step = GradientStep(fused_adam(self.policy.actor.parameters(), cfg.actor_lr), None, "fp32", device)
        self.critic_step = GradientStep(fused_adam(self.critic.parameters(), cfg.critic_lr), None, "fp32", device)
        self.largest_value = torch.zeros(())

    def update(self, batch: Batch) -> dict[str, Tensor]:
        for i in range(batch.num_batches):
            b = batch.at(i)
            obs, next_obs = self.policy.obs_norm(b.obs), self.policy.obs_norm(b.next_obs)
            with torch.no_grad():
                next_action, next_log_prob = self.policy(b.next_obs, self.generator)
                target = soft_td_target(
                    self.reward_norm(b.reward), bootstrap_factor(b.discount, b.terminated),
                    self.critic_target(next_obs, next_action), next_log_prob, self.alpha,
                )
            q = self.critic(obs, b.action)
            q_loss = td_loss(q, target, "mse", 1.0)
            self.critic_step(q_loss)
            polyak_update_(self.critic, self.critic_target, self.cfg.tau)
        last = batch.at(-1).obs
        action, log_prob = self.policy(last, self.generator)
        with frozen(self.critic):
            actor_loss = sac_actor_loss(log_prob, self.critic(self.policy.obs_norm(last), action), self.alpha)
        self.actor_step(actor_loss)
        self.largest_value = q.detach().abs().max()
        return {"critic/q_loss": q_loss.detach(), "actor/loss": actor_loss.detach(), "actor/entropy": -log_prob.mean()}

    def parts(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
        }


ALGORITHM = Registered(FixedAlphaSACConfig, FixedAlphaSAC, make_policy)
