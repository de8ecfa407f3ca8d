"""Soft Actor-Critic with twin critics and an automatically tuned temperature.

References: Haarnoja et al. 2018, "Soft Actor-Critic" (arXiv 1801.01290) and "Soft Actor-Critic
Algorithms and Applications" (arXiv 1812.05905) for the temperature loss; CleanRL's
`sac_continuous_action.py` for the single-file shape. Deliberate choices:
- the two critics are one batched ensemble (one matmul per layer for both);
- the actor and temperature update once per fleet step on the last batch of the stack, the
  critics `utd_ratio` times (see README, "UTD ratio").
"""

from __future__ import annotations

import copy
import math
from typing import Literal

import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from aa_ray.algos.common import Batch, grad_norm, polyak_update_, tensors_to_cpu
from aa_ray.nets.mlp import EnsembleQ, MLPActor
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.spec.base import SpecModel


class SACConfig(SpecModel):
    name: Literal["sac"] = "sac"
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    n_step: PositiveInt = Field(1, description="n-step returns (1 = one-step TD)")
    tau: float = Field(0.005, gt=0, le=1, description="polyak rate of the target critics")
    batch_size: PositiveInt = Field(256, description="transitions per gradient step")
    buffer_size: PositiveInt = Field(1_000_000, description="replay capacity in transitions")
    warm_up_steps: NonNegativeInt = Field(5000, description="uniform random actions until this many are stored")
    train_every: PositiveInt = Field(32, description="fleet steps collected between learner iterations")
    utd_ratio: PositiveInt = Field(1, description="critic updates per fleet step")
    actor_lr: PositiveFloat = Field(3e-4, description="actor Adam learning rate")
    critic_lr: PositiveFloat = Field(1e-3, description="critic Adam learning rate")
    alpha_lr: PositiveFloat = Field(1e-3, description="temperature Adam learning rate")
    init_alpha: PositiveFloat = Field(1.0, description="initial temperature")
    autotune_alpha: bool = Field(True, description="learn the temperature toward target_entropy")
    target_entropy: float | None = Field(None, description="null means -|A|")
    hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="MLP widths")
    normalize_obs: bool = Field(False, description="running mean/std observation normalization")


def make_policy(cfg: SACConfig, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs_dim, act_dim, cfg.hidden_dims), obs_dim, cfg.normalize_obs)


class SAC:
    def __init__(self, cfg: SACConfig, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg = cfg
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.critic = EnsembleQ(obs_dim, act_dim, cfg.hidden_dims, num_critics=2).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy

        self.actor_optimizer = torch.optim.Adam(self.policy.actor.parameters(), lr=cfg.actor_lr, fused=True)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr, fused=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr, fused=True)

    def update(self, batch: Batch, diagnostics: bool = False) -> dict[str, float]:
        """One fleet step's worth of learning: `len(batch)` critic steps, then actor and temperature."""
        info: dict[str, float] = {}
        for i in range(len(batch)):
            info = self.update_critic(batch.at(i), diagnostics and i == len(batch) - 1)
        info.update(self.update_actor_and_alpha(batch.at(-1), diagnostics))
        return info

    def update_critic(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        obs, next_obs = self.policy.obs_norm(b.obs), self.policy.obs_norm(b.next_obs)
        # soft Bellman target from the slow critics, clipped double-Q; only a true terminal masks it
        with torch.no_grad():
            next_action, next_log_prob = self.policy(b.next_obs)
            min_next_q = self.critic_target(next_obs, next_action).min(dim=0).values
            next_q_value = b.reward + b.discount * (1.0 - b.terminated) * (min_next_q - alpha * next_log_prob)
        q = self.critic(obs, b.action)  # (2, batch)
        q_loss = (q - next_q_value).pow(2).mean(dim=1).sum()

        self.critic_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        norm = grad_norm(self.critic.parameters()) if diagnostics else 0.0
        self.critic_optimizer.step()
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

    def update_actor_and_alpha(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        action, log_prob = self.policy(b.obs)
        # the critics only score the action here; skipping their weight gradients saves a third of backward
        self.critic.requires_grad_(False)
        min_q = self.critic(self.policy.obs_norm(b.obs), action).min(dim=0).values
        self.critic.requires_grad_(True)
        actor_loss = (alpha * log_prob - min_q).mean()

        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        norm = grad_norm(self.policy.actor.parameters()) if diagnostics else 0.0
        self.actor_optimizer.step()

        # temperature: raise alpha when the policy's entropy is below the target, lower it above
        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        if self.cfg.autotune_alpha:
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
