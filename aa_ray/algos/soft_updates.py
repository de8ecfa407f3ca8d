"""The SAC family's update steps (sac, sac_simba, sac_dist, sac_dist_simba), in SimbaV2's style:
each step is a function of the networks it touches, their gradient step and a batch; it takes the
step and returns its diagnostics as tensors. The variant files build the networks and list these
calls in their paper's order; the math inside each is the pure functions of `aa_ray.algos.losses`.
A SimbaV2 variant passes GradientSteps that re-project its weights after every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from aa_ray.algos.config import C51Support, TemperatureKnobs
from aa_ray.algos.knobs import GradientStep, RewardNormalizer, autocast, frozen, polyak_update_
from aa_ray.algos.losses import (
    bee_target,
    bootstrap_factor,
    categorical_cross_entropy,
    categorical_soft_target,
    critic_diagnostics,
    expectile_loss,
    rlpd_diagnostics,
    sac_actor_diagnostics,
    sac_actor_loss,
    soft_td_target,
    soft_value_target,
    support_saturation,
    td_loss,
    temperature_loss,
)
from aa_ray.nets.distributional import expected_value
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.records import Batch


def temperature(cfg: TemperatureKnobs, act_dim: int, device: torch.device) -> tuple[Tensor, float]:
    """SAC's learnable log-temperature (a bare tensor, checkpointed as `log_alpha`) and its target entropy."""
    return torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True), cfg.target_entropy_for(act_dim)


def support_reward_normalizer(cfg: C51Support, normalize_reward: bool) -> RewardNormalizer:
    """Scaled returns of either sign fit the support when max|G| maps to its nearer end (SimbaV2: 5 on [-5, 5])."""
    return RewardNormalizer(normalize_reward, v_max=cfg.support_half_width() if normalize_reward else None)


class Prepared(NamedTuple):
    """One batch as the critics see it: normalized observations (the policy normalizes the raw
    ones itself), scaled rewards, and the bootstrap factor."""

    raw: Batch
    obs: Tensor
    next_obs: Tensor
    reward: Tensor
    bootstrap: Tensor


def prepare(b: Batch, policy: SquashedGaussianPolicy, reward_norm: RewardNormalizer) -> Prepared:
    bootstrap = bootstrap_factor(b.discount, b.terminated)
    return Prepared(b, policy.obs_norm(b.obs), policy.obs_norm(b.next_obs), reward_norm(b.reward), bootstrap)


class Critics(NamedTuple):
    """The online critic (plain and DDP-wrapped), its slow target, its gradient step, and BAC's V
    (all three None without learn_v)."""

    critic: nn.Module
    critic_ddp: nn.Module
    target: nn.Module
    step: GradientStep
    value: nn.Module | None = None
    value_ddp: nn.Module | None = None
    value_step: GradientStep | None = None


def update_value(
    x: Prepared, alpha: Tensor, policy: SquashedGaussianPolicy, critics: Critics, cfg
) -> dict[str, Tensor]:
    """BAC: V(s) regresses on an upper expectile of min Q'(s, a_replay) - alpha log pi(a~|s), the
    value of the best actions the buffer has seen rather than the current policy's."""
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            _, log_prob = policy(x.raw.obs)
            target = soft_value_target(critics.target(x.obs, x.raw.action), log_prob, alpha)
        v = critics.value_ddp(x.obs)
    v_loss = expectile_loss(v, target, cfg.v_quantile)
    grad_norm = critics.value_step(v_loss)
    return {
        "critic/v_loss": v_loss.detach(), "critic/q_upper": v.detach().float().mean(), "critic/v_grad_norm": grad_norm
    }


def update_scalar_critics(
    x: Prepared, alpha: Tensor, policy: SquashedGaussianPolicy, critics: Critics, reward_scale: Tensor, cfg
) -> tuple[dict[str, Tensor], Tensor]:
    """One critic step of SAC (BAC's V first, when learned): the soft target from the slow critics
    with clipped double-Q, mixed by BEE with r + bootstrap V(s'), then polyak. Returns the
    diagnostics (RLPD's included) and the online Q values (C, B)."""
    info = update_value(x, alpha, policy, critics, cfg) if critics.value is not None else {}
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            next_action, next_log_prob = policy(x.raw.next_obs)
            next_q = critics.target(x.next_obs, next_action)  # (C, B)
            target = soft_td_target(x.reward, x.bootstrap, next_q, next_log_prob, alpha)
            if critics.value is not None:
                target = bee_target(target, x.reward, x.bootstrap, critics.value(x.next_obs), cfg.bee_lambda)
        q = critics.critic_ddp(x.obs, x.raw.action)  # (C, B)
    q_loss = td_loss(q, target, cfg.critic_loss, cfg.huber_delta)
    grad_norm = critics.step(q_loss)
    polyak_update_(critics.critic, critics.target, cfg.tau)
    info |= critic_diagnostics(q, q_loss, target, grad_norm, reward_scale)
    return info | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio), q.detach()


def update_categorical_critics(
    x: Prepared, alpha: Tensor, policy: SquashedGaussianPolicy, critics: Critics, support: Tensor,
    reward_scale: Tensor, cfg,
) -> tuple[dict[str, Tensor], Tensor]:
    """One critic step of distributional SAC: the pessimistic target critic's distribution of
    r + bootstrap (Z' - alpha log pi) projected on the support, cross-entropy, then polyak.
    Returns the diagnostics (RLPD's on E[Z]) and the online expected Q values (C, B)."""
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            next_action, next_log_prob = policy(x.raw.next_obs)
            next_logits = critics.target(x.next_obs, next_action)
            target_probs, next_probs, shifted_reward = categorical_soft_target(
                next_logits, x.reward, x.bootstrap, next_log_prob, alpha, support
            )
        logits = critics.critic_ddp(x.obs, x.raw.action)  # (C, B, N)
    q_loss = categorical_cross_entropy(logits, target_probs)
    grad_norm = critics.step(q_loss)
    polyak_update_(critics.critic, critics.target, cfg.tau)
    with torch.no_grad():
        q = expected_value(logits.detach(), support)
        info = critic_diagnostics(q, q_loss, (target_probs * support).sum(-1), grad_norm, reward_scale)
        info |= support_saturation(next_probs, shifted_reward, x.bootstrap, support)
    return info | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio), q


def update_actor_and_temperature(
    obs: Tensor,
    policy: SquashedGaussianPolicy,
    policy_ddp: nn.Module,
    critic: nn.Module,
    score: Callable[[Tensor], Tensor],  # critic output -> Q values (C, B)
    actor_step: GradientStep,
    log_alpha: Tensor,
    alpha_step: GradientStep,  # taken only with cfg.autotune_alpha
    target_entropy: float,
    cfg,
) -> dict[str, Tensor]:
    """The SAC actor step, E[alpha log pi(a|s) - min Q(s, a)], with the critics frozen (they only
    judge the action), then the temperature step toward the target entropy."""
    alpha = log_alpha.detach().exp()
    with autocast(obs.device, cfg.precision):
        action, log_prob = policy_ddp(obs)
        with frozen(critic):
            q = score(critic(policy.obs_norm(obs), action))
    actor_loss = sac_actor_loss(log_prob, q, alpha)
    grad_norm = actor_step(actor_loss)
    alpha_loss = temperature_loss(log_alpha, log_prob, target_entropy)
    if cfg.autotune_alpha:
        alpha_step(alpha_loss)
    return sac_actor_diagnostics(actor_loss, alpha, alpha_loss, log_prob, grad_norm)
