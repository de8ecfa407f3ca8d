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

import copy
import math
from functools import partial
from typing import Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from aa_ray import ddp
from aa_ray.algos.common import Batch, polyak_update_, tensors_to_cpu
from aa_ray.algos.knobs import (
    GradientStep,
    OffPolicyConfig,
    RewardNormalizer,
    autocast,
    expectile_loss,
    make_optimizer,
    prior_q_gap,
    td_loss,
)
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.nets.simba import SimbaV2Actor, SimbaV2Critic, SimbaV2Value, normalize_weights_


class SACSimbaConfig(OffPolicyConfig):
    name: Literal["sac_simba"] = "sac_simba"
    normalize_obs: bool = Field(True, description="running mean/std observation normalization")
    learning_rate: PositiveFloat = Field(1e-4, description="initial learning rate (all parts)")
    learning_rate_end: PositiveFloat = Field(5e-5, description="learning rate after the planned updates")
    init_alpha: PositiveFloat = Field(0.01, description="initial temperature")
    target_entropy_per_dim: float = Field(-0.5, description="target entropy = this x |A|")
    actor_hidden_dim: PositiveInt = Field(128, description="actor width")
    actor_num_blocks: PositiveInt = Field(1, description="actor residual blocks")
    critic_hidden_dim: PositiveInt = Field(512, description="critic width")
    critic_num_blocks: PositiveInt = Field(2, description="critic residual blocks")
    learn_v: bool = Field(False, description="BAC: learn V(s) by expectile regression on replayed actions")
    v_quantile: float = Field(0.7, gt=0, lt=1, description="BAC: expectile of V (> 0.5 is optimistic)")
    bee_lambda: float = Field(0.0, ge=0, le=1, description="BEE: weight of the exploitation target (0 = SAC)")

    @model_validator(mode="after")
    def _consistent(self) -> SACSimbaConfig:
        if self.learning_rate_end > self.learning_rate:
            raise ValueError("learning_rate_end must not exceed learning_rate (the schedule decays)")
        if self.bee_lambda > 0 and not self.learn_v:
            raise ValueError("bee_lambda > 0 needs learn_v: true (the exploitation target bootstraps from V)")
        return self


def make_policy(cfg: SACSimbaConfig, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    actor = SimbaV2Actor(obs_dim, act_dim, cfg.actor_hidden_dim, cfg.actor_num_blocks)
    return SquashedGaussianPolicy(actor, obs_dim, cfg.normalize_obs)


class SACSimba:
    def __init__(self, cfg: SACSimbaConfig, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg, self.device = cfg, device
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.critic = SimbaV2Critic(obs_dim, act_dim, cfg.critic_hidden_dim, cfg.critic_num_blocks).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = (
            SimbaV2Value(obs_dim, cfg.critic_hidden_dim, cfg.critic_num_blocks).to(device) if cfg.learn_v else None
        )
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = cfg.target_entropy_per_dim * act_dim
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(device)

        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.learning_rate))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.learning_rate))
        self.alpha_step = step(torch.optim.Adam([self.log_alpha], lr=cfg.learning_rate), average_grads=True)
        self.value_step = step(make_optimizer(self.value, cfg.optimizer, cfg.learning_rate)) if self.value else None
        self.planned_steps = max(planned_steps, 1)
        self.steps_done = 0  # fleet steps learned from, drives the learning-rate decay

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)
        self.value_ddp = ddp.wrap(self.value) if self.value else None

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
        for step in (self.actor_step, self.critic_step, self.alpha_step, self.value_step):
            for group in step.optimizer.param_groups if step else ():
                group["lr"] = lr

    def update_actor_and_alpha(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        with autocast(self.device, self.cfg.precision):
            action, log_prob = self.policy_ddp(b.obs)
            self.critic.requires_grad_(False)
            min_q = self.critic(self.policy.obs_norm(b.obs), action).min(dim=0).values
            self.critic.requires_grad_(True)
        actor_loss = (alpha * log_prob.float() - min_q.float()).mean()
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
        info = self.update_value(b, obs, alpha, diagnostics) if self.value is not None else {}
        with autocast(self.device, self.cfg.precision):
            with torch.no_grad():
                next_action, next_log_prob = self.policy(b.next_obs)
                min_next_q = self.critic_target(next_obs, next_action).min(dim=0).values
                bootstrap = b.discount * (1.0 - b.terminated)
                next_q_value = reward + bootstrap * (min_next_q - alpha * next_log_prob).float()
                if self.value is not None:  # BEE: lambda * exploitation + (1 - lambda) * exploration
                    exploit_target = reward + bootstrap * self.value(next_obs).float()
                    next_q_value = self.cfg.bee_lambda * exploit_target + (1 - self.cfg.bee_lambda) * next_q_value
            q = self.critic_ddp(obs, b.action)
        q_loss = td_loss(q, next_q_value, self.cfg.critic_loss, self.cfg.huber_delta)
        norm = self.critic_step(q_loss, measure=diagnostics)
        normalize_weights_(self.critic)
        polyak_update_(self.critic, self.critic_target, self.cfg.tau)

        if not diagnostics:
            return {}
        return info | {
            "critic/q_loss": q_loss.item() / 2,
            "critic/q_value": q.float().mean().item(),
            "critic/q_max": q.float().max().item(),
            "critic/td_target": next_q_value.mean().item(),
            "critic/grad_norm": norm,
            "critic/reward_scale": self.reward_norm.scale(),
        } | prior_q_gap(q.float(), self.cfg)

    def update_value(self, b: Batch, obs: torch.Tensor, alpha: torch.Tensor, diagnostics: bool) -> dict[str, float]:
        """BAC: V(s) is an upper expectile of min Q_target(s, a_replay) - alpha log pi(a~|s)."""
        with autocast(self.device, self.cfg.precision):
            with torch.no_grad():
                _, log_prob = self.policy(b.obs)
                target = self.critic_target(obs, b.action).min(dim=0).values - alpha * log_prob
            v = self.value_ddp(obs)
        v_loss = expectile_loss(v.float(), target.float(), self.cfg.v_quantile)
        norm = self.value_step(v_loss, measure=diagnostics)
        normalize_weights_(self.value)
        if not diagnostics:
            return {}
        return {
            "critic/v_loss": v_loss.item(),
            "critic/q_upper": v.float().mean().item(),
            "critic/v_grad_norm": norm,
        }

    def policy_state(self) -> dict[str, torch.Tensor]:
        return tensors_to_cpu(self.policy.state_dict())

    def _parts(self) -> dict:
        parts = {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
            "alpha_step": self.alpha_step,
        }
        if self.value is not None:
            parts |= {"value": self.value, "value_step": self.value_step}
        return parts

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
