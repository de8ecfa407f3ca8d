"""The SAC family (sac, sac_simba, sac_dist, sac_dist_simba, droq) as parts, in SimbaV2's style; TD3
and CrossQ build their shared parts here too.

`build_parts` turns the networks a variant's file makes (its policy, its critic, BAC's V) into an
`ActorCriticParts`: the slow targets, the temperature, the gradient steps, the lr schedule and the
DDP wrappers, built in one fixed order (the order of the optimizers' and the schedule's groups,
which checkpoints and resumes rely on). `fleet_step` is the SAC update for either critic kind
(scalar, or categorical on a support) in either order (SAC's critics then actor, SimbaV2's actor
then critics). Each step below is a function of the parts and a batch; the math inside each is the
pure functions of `aa_ray.algos.losses`. A SimbaV2 variant's parts put its weights back on the
sphere after every step.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos.config import C51Support, TemperatureKnobs
from aa_ray.algos.contexts import autocast, frozen
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.gradient_step import GradientStep, polyak_update_
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
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.optimizers import fused_adam, make_optimizer
from aa_ray.algos.schedules import LinearLRSchedule, every_group
from aa_ray.nets.distributional import expected_value
from aa_ray.nets.mlp import MLPActor
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.nets.simba import SimbaV2Actor
from aa_ray.records import Batch, ObsDims


def mlp_policy(cfg: Any, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    """The acting policy of the MLP variants (sac, sac_dist, droq): a ReLU MLP's tanh-Gaussian."""
    return SquashedGaussianPolicy(MLPActor(obs.actor, act_dim, cfg.actor_hidden_dims), obs, cfg.normalize_obs)


def simba_policy(cfg: Any, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    """The acting policy of the SimbaV2 variants (sac_simba, sac_dist_simba)."""
    actor = SimbaV2Actor(obs.actor, act_dim, cfg.actor_hidden_dim, cfg.actor_num_blocks)
    return SquashedGaussianPolicy(actor, obs, cfg.normalize_obs)


@dataclass
class ActorCriticParts:
    """What an actor-critic variant is made of, in checkpoint order. The online modules come with
    their DDP-wrapped selves (with several learners DDP averages their gradients; targets and
    normalizers stay plain). Optional parts are None where the variant has none: the slow critic
    (CrossQ), the slow actor (TD3 only), the temperature (TD3), BAC's V, the categorical support
    (scalar critics)."""

    cfg: Any  # the variant's config: OffPolicyKnobs and the knobs its steps read
    generator: torch.Generator  # the learner's: every random draw of the updates
    policy: nn.Module
    policy_ddp: nn.Module
    critic: nn.Module
    critic_ddp: nn.Module
    critic_target: nn.Module | None
    actor_target: nn.Module | None
    reward_norm: RewardNormalizer
    actor_step: GradientStep
    critic_step: GradientStep
    schedule: LinearLRSchedule
    log_alpha: Tensor | None  # SAC's learnable log-temperature, a bare tensor
    target_entropy: float
    alpha_step: GradientStep | None  # taken only with cfg.autotune_alpha
    value: nn.Module | None
    value_ddp: nn.Module | None
    value_step: GradientStep | None
    support: Tensor | None  # the atoms of categorical critics

    def checkpoint_parts(self) -> dict[str, Any]:
        """The parts under the checkpoint keys every variant uses (absent parts left out)."""
        parts: dict[str, Any] = {"policy": self.policy, "critic": self.critic}
        optional = {
            "critic_target": self.critic_target, "actor_target": self.actor_target, "reward_norm": self.reward_norm,
            "actor_step": self.actor_step, "critic_step": self.critic_step, "alpha_step": self.alpha_step,
            "log_alpha": self.log_alpha, "value": self.value, "value_step": self.value_step,
        }
        return parts | {key: part for key, part in optional.items() if part is not None} | {"steps_done": self.schedule}


def build_parts(
    cfg: Any, act_dim: int, setup: TrainingSetup, *, policy: nn.Module, critic: nn.Module,
    reward_norm: RewardNormalizer, value: nn.Module | None = None, support: Tensor | None = None,
    slow_critic: bool = True, slow_actor: bool = False, temperature_learned: bool = True, beta1: float = 0.9,
    project: Callable[[nn.Module, Tensor], None] | None = None,
) -> ActorCriticParts:
    """The parts around the networks a variant made (in the order given, the order their weights were
    drawn in): the slow `critic_target` (`slow_critic`), TD3's slow actor (`slow_actor`), the
    temperature (`temperature_learned`), a gradient step for each network and the temperature (Adam
    with first-moment decay `beta1`, or Muon with `cfg.optimizer`; `project(module, taken)` after
    every step of a network, for SimbaV2's hyperspherical weights) and one lr schedule over them all."""
    device, generator = setup.device, setup.generator
    policy, critic = policy.to(device), critic.to(device)
    actor_target = copy.deepcopy(policy.actor).requires_grad_(False) if slow_actor else None
    critic_target = None
    if slow_critic:  # the target draws DroQ's dropout masks from the same generator, not from a copy of it
        critic_target = copy.deepcopy(critic, memo={id(generator): generator}).requires_grad_(False)
    value = value.to(device) if value is not None else None
    log_alpha, target_entropy = temperature(cfg, act_dim, device) if temperature_learned else (None, 0.0)

    def step(module: nn.Module, lr: float) -> GradientStep:
        return GradientStep(
            make_optimizer(module, cfg.optimizer, lr, beta1), cfg.max_grad_norm, cfg.precision, device,
            project=partial(project, module) if project is not None else None,
        )

    actor_step, critic_step = step(policy.actor, cfg.actor_lr), step(critic, cfg.critic_lr)
    alpha_step = None if log_alpha is None else GradientStep(
        fused_adam([log_alpha], cfg.alpha_lr, beta1=beta1), cfg.max_grad_norm, cfg.precision, device,
        average_grads=True,
    )
    value_step = step(value, cfg.critic_lr) if value is not None else None
    schedule = LinearLRSchedule(
        every_group(actor_step, critic_step, alpha_step, value_step), cfg.lr_end_fraction, setup.planned_steps
    )
    return ActorCriticParts(
        cfg=cfg, generator=generator, policy=policy, policy_ddp=ddp.wrap(policy), critic=critic,
        critic_ddp=ddp.wrap(critic), critic_target=critic_target, actor_target=actor_target,
        reward_norm=reward_norm.to(device), actor_step=actor_step, critic_step=critic_step, schedule=schedule,
        log_alpha=log_alpha, target_entropy=target_entropy, alpha_step=alpha_step, value=value,
        value_ddp=ddp.wrap(value) if value is not None else None, value_step=value_step, support=support,
    )


UpdateOrder = Literal["critics_then_actor", "actor_then_critics"]


def fleet_step(p: ActorCriticParts, batch: Batch, order: UpdateOrder) -> tuple[dict[str, Tensor], Tensor]:
    """One fleet step of the SAC family: `batch.num_batches` critic (and V) steps, each followed by
    the target's polyak step, and one actor and temperature step: after the critics on the last
    batch (SAC's order), or before them on the first batch (SimbaV2's); then the lrs move along their
    decay. The critic step is the categorical one when the critics have a support. Returns the
    diagnostics and the largest |Q| of the last critic step."""
    critic_update = update_categorical_critics if p.support is not None else update_scalar_critics
    info: dict[str, Tensor] = {}
    if order == "actor_then_critics":
        info |= update_actor_and_temperature(p, batch.at(0).obs)
    alpha = p.log_alpha.detach().exp()
    for i in range(batch.num_batches):
        critic_info, q = critic_update(p, prepare(batch.at(i), p.policy, p.reward_norm), alpha)
    if order == "critics_then_actor":
        info |= update_actor_and_temperature(p, batch.at(-1).obs)
    info = critic_info | info | {m.ACTOR_LR: p.schedule.current_lr()}
    p.schedule.advance()
    return info, q.abs().max()


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


def update_value(p: ActorCriticParts, x: Prepared, alpha: Tensor) -> dict[str, Tensor]:
    """BAC: V(s) regresses on an upper expectile of min Q'(s, a_replay) - alpha log pi(a~|s), the
    value of the best actions the buffer has seen rather than the current policy's."""
    with autocast(x.obs.device, p.cfg.precision):
        with torch.no_grad():
            _, log_prob = p.policy(x.raw.obs, p.generator)
            target = soft_value_target(p.critic_target(x.obs, x.raw.action), log_prob, alpha)
        v = p.value_ddp(x.obs)
    v_loss = expectile_loss(v, target, p.cfg.v_quantile)
    grad_norm = p.value_step(v_loss)
    return {
        "critic/v_loss": v_loss.detach(), "critic/q_upper": v.detach().float().mean(), "critic/v_grad_norm": grad_norm
    }


def update_scalar_critics(p: ActorCriticParts, x: Prepared, alpha: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """One critic step of SAC (BAC's V first, when learned): the soft target from the slow critics
    with clipped double-Q, mixed by BEE with r + bootstrap V(s'), then polyak. Returns the
    diagnostics (RLPD's included) and the online Q values (C, B)."""
    cfg = p.cfg
    info = update_value(p, x, alpha) if p.value is not None else {}
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            next_action, next_log_prob = p.policy(x.raw.next_obs, p.generator)
            next_q = p.critic_target(x.next_obs, next_action)  # (C, B)
            target = soft_td_target(x.reward, x.bootstrap, next_q, next_log_prob, alpha)
            if p.value is not None:
                target = bee_target(target, x.reward, x.bootstrap, p.value(x.next_obs), cfg.bee_lambda)
        q = p.critic_ddp(x.obs, x.raw.action)  # (C, B)
    q_loss = td_loss(q, target, cfg.critic_loss, cfg.huber_delta)
    grad_norm = p.critic_step(q_loss)
    polyak_update_(p.critic, p.critic_target, cfg.tau)
    info |= critic_diagnostics(q, q_loss, target, grad_norm, p.reward_norm.scale())
    return info | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio), q.detach()


def update_categorical_critics(
    p: ActorCriticParts, x: Prepared, alpha: Tensor
) -> tuple[dict[str, Tensor], Tensor]:
    """One critic step of distributional SAC: the pessimistic target critic's distribution of
    r + bootstrap (Z' - alpha log pi) projected on the support, cross-entropy, then polyak.
    Returns the diagnostics (RLPD's on E[Z]) and the online expected Q values (C, B)."""
    cfg, support = p.cfg, p.support
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            next_action, next_log_prob = p.policy(x.raw.next_obs, p.generator)
            next_logits = p.critic_target(x.next_obs, next_action)
            target_probs, next_probs, shifted_reward = categorical_soft_target(
                next_logits, x.reward, x.bootstrap, next_log_prob, alpha, support
            )
        logits = p.critic_ddp(x.obs, x.raw.action)  # (C, B, N)
    q_loss = categorical_cross_entropy(logits, target_probs)
    grad_norm = p.critic_step(q_loss)
    polyak_update_(p.critic, p.critic_target, cfg.tau)
    with torch.no_grad():
        q = expected_value(logits.detach(), support)
        info = critic_diagnostics(q, q_loss, (target_probs * support).sum(-1), grad_norm, p.reward_norm.scale())
        info |= support_saturation(next_probs, shifted_reward, x.bootstrap, support)
    return info | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio), q


def update_actor_and_temperature(p: ActorCriticParts, obs: Tensor) -> dict[str, Tensor]:
    """The SAC actor step, E[alpha log pi(a|s) - min Q(s, a)] (Q the expected value of categorical
    critics), with the critics frozen (they only judge the action), then the temperature step toward
    the target entropy."""
    alpha = p.log_alpha.detach().exp()
    with autocast(obs.device, p.cfg.precision):
        action, log_prob = p.policy_ddp(obs, p.generator)
        with frozen(p.critic):
            q = p.critic(p.policy.obs_norm(obs), action)
            if p.support is not None:
                q = expected_value(q, p.support)
    actor_loss = sac_actor_loss(log_prob, q, alpha)
    grad_norm = p.actor_step(actor_loss)
    alpha_loss = temperature_loss(p.log_alpha, log_prob, p.target_entropy)
    if p.cfg.autotune_alpha:
        p.alpha_step(alpha_loss)
    return sac_actor_diagnostics(actor_loss, alpha, alpha_loss, log_prob, grad_norm)
