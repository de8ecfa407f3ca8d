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
from aa_ray.nets.mlp import EnsembleQ, MLPActor, MLPValue
from aa_ray.nets.policy import SquashedGaussianPolicy


class SACConfig(OffPolicyConfig):
    name: Literal["sac"] = "sac"
    actor_lr: PositiveFloat = Field(3e-4, description="actor learning rate")
    critic_lr: PositiveFloat = Field(1e-3, description="critic (and V) learning rate")
    alpha_lr: PositiveFloat = Field(1e-3, description="temperature learning rate")
    init_alpha: PositiveFloat = Field(1.0, description="initial temperature")
    autotune_alpha: bool = Field(True, description="learn the temperature toward target_entropy")
    target_entropy: float | None = Field(None, description="null means -|A|")
    hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="MLP widths")
    layer_norm: bool = Field(False, description="LayerNorm in the critics (as RLPD recommends with prior_data)")
    learn_v: bool = Field(False, description="BAC: learn V(s) by expectile regression on replayed actions")
    v_quantile: float = Field(0.7, gt=0, lt=1, description="BAC: expectile of V (> 0.5 is optimistic)")
    bee_lambda: float = Field(0.0, ge=0, le=1, description="BEE: weight of the exploitation target (0 = SAC)")

    @model_validator(mode="after")
    def _bee_needs_v(self) -> SACConfig:
        if self.bee_lambda > 0 and not self.learn_v:
            raise ValueError("bee_lambda > 0 needs learn_v: true (the exploitation target bootstraps from V)")
        return self


def make_policy(cfg: SACConfig, obs_dim: int, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(MLPActor(obs_dim, act_dim, cfg.hidden_dims), obs_dim, cfg.normalize_obs)


class SAC:
    def __init__(self, cfg: SACConfig, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg, self.device = cfg, device
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.critic = EnsembleQ(obs_dim, act_dim, cfg.hidden_dims, num_critics=2, layer_norm=cfg.layer_norm).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = MLPValue(obs_dim, cfg.hidden_dims).to(device) if cfg.learn_v else None
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(device)

        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.actor_lr))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.critic_lr))
        self.alpha_step = step(torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr), average_grads=True)
        self.value_step = step(make_optimizer(self.value, cfg.optimizer, cfg.critic_lr)) if self.value else None

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)
        self.value_ddp = ddp.wrap(self.value) if self.value else None

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
        info = self.update_value(b, obs, alpha, diagnostics) if self.value is not None else {}
        with autocast(self.device, self.cfg.precision):
            # soft Bellman target from the slow critics, clipped double-Q; only a true terminal masks it
            with torch.no_grad():
                next_action, next_log_prob = self.policy(b.next_obs)
                min_next_q = self.critic_target(next_obs, next_action).min(dim=0).values
                bootstrap = b.discount * (1.0 - b.terminated)
                next_q_value = reward + bootstrap * (min_next_q - alpha * next_log_prob).float()
                if self.value is not None:  # BEE: lambda * exploitation + (1 - lambda) * exploration
                    exploit_target = reward + bootstrap * self.value(next_obs).float()
                    next_q_value = self.cfg.bee_lambda * exploit_target + (1 - self.cfg.bee_lambda) * next_q_value
            q = self.critic_ddp(obs, b.action)  # (2, batch)
        q_loss = td_loss(q, next_q_value, self.cfg.critic_loss, self.cfg.huber_delta)
        norm = self.critic_step(q_loss, measure=diagnostics)
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
        """BAC: V(s) is an upper expectile of min Q_target(s, a_replay) - alpha log pi(a~|s): the value of
        the best actions the buffer has seen, not of the current policy's."""
        with autocast(self.device, self.cfg.precision):
            with torch.no_grad():
                _, log_prob = self.policy(b.obs)
                target = self.critic_target(obs, b.action).min(dim=0).values - alpha * log_prob
            v = self.value_ddp(obs)
        v_loss = expectile_loss(v.float(), target.float(), self.cfg.v_quantile)
        norm = self.value_step(v_loss, measure=diagnostics)
        if not diagnostics:
            return {}
        return {
            "critic/v_loss": v_loss.item(),
            "critic/q_upper": v.float().mean().item(),
            "critic/v_grad_norm": norm,
        }

    def update_actor_and_alpha(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        with autocast(self.device, self.cfg.precision):
            action, log_prob = self.policy_ddp(b.obs)
            # the critics only score the action here; skipping their weight gradients saves a third of backward
            self.critic.requires_grad_(False)
            min_q = self.critic(self.policy.obs_norm(b.obs), action).min(dim=0).values
            self.critic.requires_grad_(True)
        actor_loss = (alpha * log_prob.float() - min_q.float()).mean()
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
        return state | {"log_alpha": self.log_alpha.detach()}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self._parts().items():
            part.load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
