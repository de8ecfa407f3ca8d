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
import math
from functools import partial
from typing import Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from aa_ray import ddp
from aa_ray.algos.common import Batch, polyak_update_, tensors_to_cpu
from aa_ray.algos.knobs import GradientStep, OffPolicyConfig, RewardNormalizer, autocast, make_optimizer
from aa_ray.nets.distributional import (
    EnsembleCategoricalQ,
    expected_value,
    make_support,
    project_distribution,
    saturation,
)
from aa_ray.nets.mlp import MLPActor
from aa_ray.nets.policy import SquashedGaussianPolicy


class SACDistConfig(OffPolicyConfig):
    name: Literal["sac_dist"] = "sac_dist"
    actor_lr: PositiveFloat = Field(3e-4, description="actor learning rate")
    critic_lr: PositiveFloat = Field(1e-3, description="critic learning rate")
    alpha_lr: PositiveFloat = Field(1e-3, description="temperature learning rate")
    init_alpha: PositiveFloat = Field(1.0, description="initial temperature")
    autotune_alpha: bool = Field(True, description="learn the temperature toward target_entropy")
    target_entropy: float | None = Field(None, description="null means -|A|")
    hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="MLP widths")
    num_atoms: int = Field(101, ge=2, description="atoms of the categorical support")
    v_min: float = Field(-20.0, description="lowest atom (soft return, in reward units after any scaling)")
    v_max: float = Field(20.0, description="highest atom; +-20 holds soft returns of |r| <~ 0.2 at gamma 0.99")

    @model_validator(mode="after")
    def _consistent(self) -> SACDistConfig:
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min must be below v_max (got {self.v_min} and {self.v_max})")
        if self.normalize_reward and not self.v_min < 0 < self.v_max:
            raise ValueError("normalize_reward scales returns to fit the support: it needs v_min < 0 < v_max")
        if self.critic_loss != "mse":
            raise ValueError("critic_loss applies to scalar critics; the categorical critics use cross-entropy")
        return self


def make_policy(cfg: SACDistConfig, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs_dim, act_dim, cfg.hidden_dims), obs_dim, cfg.normalize_obs)


class SACDist:
    def __init__(self, cfg: SACDistConfig, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg, self.device = cfg, device
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.critic = EnsembleCategoricalQ(obs_dim, act_dim, cfg.hidden_dims, cfg.num_atoms, num_critics=2).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, device)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        # scaled returns of either sign fit the support when max|G| maps to its nearer end (SimbaV2: 5 on [-5, 5])
        half_width = min(-cfg.v_min, cfg.v_max) if cfg.normalize_reward else None
        self.reward_norm = RewardNormalizer(cfg.normalize_reward, v_max=half_width).to(device)

        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.actor_lr))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.critic_lr))
        self.alpha_step = step(torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr), average_grads=True)

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)

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

    def update_actor_and_alpha(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        with autocast(self.device, self.cfg.precision):
            action, log_prob = self.policy_ddp(b.obs)
            # the critics only score the action here; skipping their weight gradients saves a third of backward
            self.critic.requires_grad_(False)
            logits = self.critic(self.policy.obs_norm(b.obs), action)
            self.critic.requires_grad_(True)
        min_q = expected_value(logits, self.support).min(dim=0).values
        actor_loss = (alpha * log_prob.float() - min_q).mean()
        norm = self.actor_step(actor_loss, measure=diagnostics)

        # temperature: raise alpha when the policy's entropy is below the target, lower it above
        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach().float() + self.target_entropy)).mean()
        if self.cfg.autotune_alpha:
            self.alpha_step(alpha_loss)

        if not diagnostics:
            return {}
        return {
            "actor/loss": actor_loss.item(),
            "actor/alpha": alpha.item(),
            "actor/alpha_loss": alpha_loss.item(),
            "actor/entropy": -log_prob.float().mean().item(),
            "actor/grad_norm": norm,
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
        return state | {"log_alpha": self.log_alpha.detach()}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self._parts().items():
            part.load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
