"""SAC with SimbaV2 actor and critics (scalar twin critics).

Reference: Lee et al. 2025, "Hyperspherical Normalization for Scalable Deep Reinforcement
Learning" (SimbaV2, arXiv 2502.15280) and its official code (dojeon-ai/SimbaV2). Taken from there:
hyperspherical bias-free layers with weights re-projected to the unit sphere after every
optimizer step, running observation normalization, Adam without weight decay with the learning
rate decayed linearly from 1e-4 to 5e-5, initial temperature 0.01, target entropy -|A|/2, and
the update order actor -> temperature -> critic -> target. The paper's critic is distributional;
this variant keeps a scalar critic (the distributional one is `sac_dist_simba`).
"""

from __future__ import annotations

import copy
import math
from typing import Literal

import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from aa_ray.algos.common import Batch, grad_norm, polyak_update_, tensors_to_cpu
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.nets.simba import SimbaV2Actor, SimbaV2Critic, normalize_weights_
from aa_ray.spec.base import SpecModel


class SACSimbaConfig(SpecModel):
    name: Literal["sac_simba"] = "sac_simba"
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    n_step: PositiveInt = Field(1, description="n-step returns (1 = one-step TD)")
    tau: float = Field(0.005, gt=0, le=1, description="polyak rate of the target critics")
    batch_size: PositiveInt = Field(256, description="transitions per gradient step")
    buffer_size: PositiveInt = Field(1_000_000, description="replay capacity in transitions")
    warm_up_steps: NonNegativeInt = Field(5000, description="uniform random actions until this many are stored")
    train_every: PositiveInt = Field(32, description="fleet steps collected between learner iterations")
    utd_ratio: PositiveInt = Field(1, description="critic updates per fleet step")
    learning_rate: PositiveFloat = Field(1e-4, description="initial Adam learning rate (all parts)")
    learning_rate_end: PositiveFloat = Field(5e-5, description="learning rate after the planned updates")
    init_alpha: PositiveFloat = Field(0.01, description="initial temperature")
    target_entropy_per_dim: float = Field(-0.5, description="target entropy = this x |A|")
    actor_hidden_dim: PositiveInt = Field(128, description="actor width")
    actor_num_blocks: PositiveInt = Field(1, description="actor residual blocks")
    critic_hidden_dim: PositiveInt = Field(512, description="critic width")
    critic_num_blocks: PositiveInt = Field(2, description="critic residual blocks")
    normalize_obs: bool = Field(True, description="running mean/std observation normalization")

    @model_validator(mode="after")
    def _decay_down(self) -> SACSimbaConfig:
        if self.learning_rate_end > self.learning_rate:
            raise ValueError("learning_rate_end must not exceed learning_rate (the schedule decays)")
        return self


def make_policy(cfg: SACSimbaConfig, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    actor = SimbaV2Actor(obs_dim, act_dim, cfg.actor_hidden_dim, cfg.actor_num_blocks)
    return SquashedGaussianPolicy(actor, obs_dim, cfg.normalize_obs)


class SACSimba:
    def __init__(self, cfg: SACSimbaConfig, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg = cfg
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.critic = SimbaV2Critic(obs_dim, act_dim, cfg.critic_hidden_dim, cfg.critic_num_blocks).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = cfg.target_entropy_per_dim * act_dim

        self.actor_optimizer = torch.optim.Adam(self.policy.actor.parameters(), lr=cfg.learning_rate, fused=True)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.learning_rate, fused=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.learning_rate, fused=True)
        self.planned_steps = max(planned_steps, 1)
        self.steps_done = 0  # fleet steps learned from, drives the learning-rate decay

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
        for optimizer in (self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer):
            for group in optimizer.param_groups:
                group["lr"] = lr

    def update_actor_and_alpha(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        action, log_prob = self.policy(b.obs)
        self.critic.requires_grad_(False)
        min_q = self.critic(self.policy.obs_norm(b.obs), action).min(dim=0).values
        self.critic.requires_grad_(True)
        actor_loss = (alpha * log_prob - min_q).mean()

        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        norm = grad_norm(self.policy.actor.parameters()) if diagnostics else 0.0
        self.actor_optimizer.step()
        normalize_weights_(self.policy.actor)  # back onto the hypersphere after every step

        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optimizer.step()

        if not diagnostics:
            return {}
        return {
            "actor/loss": actor_loss.item(),
            "actor/alpha": alpha.item(),
            "actor/alpha_loss": alpha_loss.item(),
            "actor/entropy": -log_prob.mean().item(),
            "actor/grad_norm": norm,
            "actor/learning_rate": self.actor_optimizer.param_groups[0]["lr"],
        }

    def update_critic(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        obs, next_obs = self.policy.obs_norm(b.obs), self.policy.obs_norm(b.next_obs)
        with torch.no_grad():
            next_action, next_log_prob = self.policy(b.next_obs)
            min_next_q = self.critic_target(next_obs, next_action).min(dim=0).values
            next_q_value = b.reward + b.discount * (1.0 - b.terminated) * (min_next_q - alpha * next_log_prob)
        q = self.critic(obs, b.action)
        q_loss = (q - next_q_value).pow(2).mean(dim=1).sum()

        self.critic_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        norm = grad_norm(self.critic.parameters()) if diagnostics else 0.0
        self.critic_optimizer.step()
        normalize_weights_(self.critic)
        polyak_update_(self.critic, self.critic_target, self.cfg.tau)

        if not diagnostics:
            return {}
        return {
            "critic/q_loss": q_loss.item() / 2,
            "critic/q_value": q.mean().item(),
            "critic/q_max": q.max().item(),
            "critic/td_target": next_q_value.mean().item(),
            "critic/grad_norm": norm,
        }

    def policy_state(self) -> dict[str, torch.Tensor]:
        return tensors_to_cpu(self.policy.state_dict())

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.steps_done = int(state["steps_done"])
        self._decay_learning_rate()

