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

import copy
import math
from functools import partial
from typing import Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from aa_ray import ddp
from aa_ray.algos.common import Batch, polyak_update_, tensors_to_cpu
from aa_ray.algos.knobs import GradientStep, OffPolicyConfig, RewardNormalizer, autocast, make_optimizer
from aa_ray.nets.distributional import (
    SimbaV2CategoricalCritic,
    expected_value,
    make_support,
    project_distribution,
    saturation,
)
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.nets.simba import SimbaV2Actor, normalize_weights_


class SACDistSimbaConfig(OffPolicyConfig):
    name: Literal["sac_dist_simba"] = "sac_dist_simba"
    normalize_obs: bool = Field(True, description="running mean/std observation normalization")
    normalize_reward: bool = Field(True, description="scale rewards so running returns fit the support")
    learning_rate: PositiveFloat = Field(1e-4, description="initial learning rate (all parts)")
    learning_rate_end: PositiveFloat = Field(5e-5, description="learning rate after the planned updates")
    init_alpha: PositiveFloat = Field(0.01, description="initial temperature")
    target_entropy_per_dim: float = Field(-0.5, description="target entropy = this x |A|")
    actor_hidden_dim: PositiveInt = Field(128, description="actor width")
    actor_num_blocks: PositiveInt = Field(1, description="actor residual blocks")
    critic_hidden_dim: PositiveInt = Field(512, description="critic width")
    critic_num_blocks: PositiveInt = Field(2, description="critic residual blocks")
    num_atoms: int = Field(101, ge=2, description="atoms of the categorical support")
    v_min: float = Field(-5.0, description="lowest atom (soft return, in scaled reward units)")
    v_max: float = Field(5.0, description="highest atom; the reward scaling maps max|G| to min(-v_min, v_max)")

    @model_validator(mode="after")
    def _consistent(self) -> SACDistSimbaConfig:
        if self.learning_rate_end > self.learning_rate:
            raise ValueError("learning_rate_end must not exceed learning_rate (the schedule decays)")
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min must be below v_max (got {self.v_min} and {self.v_max})")
        if self.normalize_reward and not self.v_min < 0 < self.v_max:
            raise ValueError("normalize_reward scales returns to fit the support: it needs v_min < 0 < v_max")
        if self.critic_loss != "mse":
            raise ValueError("critic_loss applies to scalar critics; the categorical critics use cross-entropy")
        return self


def make_policy(cfg: SACDistSimbaConfig, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    actor = SimbaV2Actor(obs_dim, act_dim, cfg.actor_hidden_dim, cfg.actor_num_blocks)
    return SquashedGaussianPolicy(actor, obs_dim, cfg.normalize_obs)


class SACDistSimba:
    def __init__(
        self, cfg: SACDistSimbaConfig, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0
    ):
        self.cfg, self.device = cfg, device
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.critic = SimbaV2CategoricalCritic(
            obs_dim, act_dim, cfg.critic_hidden_dim, cfg.critic_num_blocks, cfg.num_atoms
        ).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, device)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = cfg.target_entropy_per_dim * act_dim
        # scaled returns of either sign fit the support when max|G| maps to its nearer end (SimbaV2: 5 on [-5, 5])
        half_width = min(-cfg.v_min, cfg.v_max) if cfg.normalize_reward else None
        self.reward_norm = RewardNormalizer(cfg.normalize_reward, v_max=half_width).to(device)

        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.learning_rate))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.learning_rate))
        self.alpha_step = step(torch.optim.Adam([self.log_alpha], lr=cfg.learning_rate), average_grads=True)
        self.planned_steps = max(planned_steps, 1)
        self.steps_done = 0  # fleet steps learned from, drives the learning-rate decay

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)

    def update(self, batch: Batch, diagnostics: bool = False) -> dict[str, float]:
        """SimbaV2's order: actor and temperature first, then `len(batch)` critic steps."""
        info = self.update_actor_and_alpha(batch.at(0), diagnostics)
        for i in range(len(batch)):
            info.update(self.update_critic(batch.at(i), diagnostics and i == len(batch) - 1))
        self.steps_done += 1
        self._decay_learning_rate()
        return info

    def _decay_learning_rate(self) -> None:
        progress = min(self.steps_done / self.planned_steps, 1.0)
        lr = self.cfg.learning_rate + progress * (self.cfg.learning_rate_end - self.cfg.learning_rate)
        for step in (self.actor_step, self.critic_step, self.alpha_step):
            for group in step.optimizer.param_groups:
                group["lr"] = lr

    def update_actor_and_alpha(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        with autocast(self.device, self.cfg.precision):
            action, log_prob = self.policy_ddp(b.obs)
            self.critic.requires_grad_(False)
            logits = self.critic(self.policy.obs_norm(b.obs), action)
            self.critic.requires_grad_(True)
        min_q = expected_value(logits, self.support).min(dim=0).values  # the actor sees expected Q
        actor_loss = (alpha * log_prob.float() - min_q).mean()
        norm = self.actor_step(actor_loss, measure=diagnostics)
        normalize_weights_(self.policy.actor)  # back onto the hypersphere after every step

        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach().float() + self.target_entropy)).mean()
        self.alpha_step(alpha_loss)

        if not diagnostics:
            return {}
        return {
            "actor/loss": actor_loss.item(),
            "actor/alpha": alpha.item(),
            "actor/alpha_loss": alpha_loss.item(),
            "actor/entropy": -log_prob.float().mean().item(),
            "actor/grad_norm": norm,
            "actor/learning_rate": self.actor_step.optimizer.param_groups[0]["lr"],
        }

    def update_critic(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        obs, next_obs = self.policy.obs_norm(b.obs), self.policy.obs_norm(b.next_obs)
        reward = self.reward_norm(b.reward)
        with autocast(self.device, self.cfg.precision):
            with torch.no_grad():
                next_action, next_log_prob = self.policy(b.next_obs)
                next_probs = torch.softmax(self.critic_target(next_obs, next_action).float(), dim=-1)  # (2, B, N)
                # clipped double-Q on distributions: per sample, the target critic with the lower mean
                next_q = (next_probs * self.support).sum(-1)  # (2, B)
                pessimist = next_q.argmin(dim=0)  # (B,)
                next_probs = next_probs[pessimist, torch.arange(pessimist.shape[0], device=self.device)]  # (B, N)
                # soft target atoms r + bootstrap * (z_j - alpha log pi); only a true terminal masks it
                bootstrap = b.discount * (1.0 - b.terminated)
                soft_reward = reward - bootstrap * alpha * next_log_prob.float()
                target_probs = project_distribution(next_probs, soft_reward, bootstrap, self.support)
            logits = self.critic_ddp(obs, b.action)  # (2, B, N)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        q_loss = -(target_probs * log_probs).sum(-1).mean(-1).sum()  # cross-entropy, summed over the critics
        norm = self.critic_step(q_loss, measure=diagnostics)
        normalize_weights_(self.critic)
        polyak_update_(self.critic, self.critic_target, self.cfg.tau)

        if not diagnostics:
            return {}
        with torch.no_grad():
            q = (log_probs.exp() * self.support).sum(-1)
            low, high = saturation(next_probs, soft_reward, bootstrap, self.support)
        return {
            "critic/q_loss": q_loss.item() / 2,
            "critic/q_value": q.mean().item(),
            "critic/q_max": q.max().item(),
            "critic/td_target": (target_probs * self.support).sum(-1).mean().item(),
            "critic/grad_norm": norm,
            "critic/reward_scale": self.reward_norm.scale(),
            "critic/support_saturation_low": low.item(),
            "critic/support_saturation_high": high.item(),
        }

    def policy_state(self) -> dict[str, torch.Tensor]:
        return tensors_to_cpu(self.policy.state_dict())

    def _parts(self) -> dict:
        return {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
            "alpha_step": self.alpha_step,
        }

    def state_dict(self) -> dict:
        state = {name: part.state_dict() for name, part in self._parts().items()}
        return state | {"log_alpha": self.log_alpha.detach(), "steps_done": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self._parts().items():
            part.load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.steps_done = int(state["steps_done"])
        self._decay_learning_rate()
