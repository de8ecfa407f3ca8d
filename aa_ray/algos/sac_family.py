"""The SAC family (sac, sac_simba, sac_dist, sac_dist_simba, droq; crossq takes its steps): what
every variant is made of and its update steps, in SimbaV2's style.

`assemble_` builds a variant's shared parts from the networks its file makes (its policy, its
critic, BAC's V): the slow target, the temperature, the gradient steps, the lr schedule and the
DDP wrappers; `checkpoint_parts` lists them for checkpoints. Each step is a function of the
networks it touches, their gradient step and a batch; it takes the step and returns its
diagnostics as tensors. The variant files list these calls in their paper's order; the math inside
each is the pure functions of `aa_ray.algos.losses`. A SimbaV2 variant passes a projection that
puts its weights back on the sphere after every step.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

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


def assemble_(
    algo: Any, cfg: Any, act_dim: int, setup: TrainingSetup, *, policy: SquashedGaussianPolicy, critic: nn.Module,
    reward_norm: RewardNormalizer, value: nn.Module | None = None,
    project: Callable[[nn.Module, Tensor], None] | None = None,
) -> None:
    """Give `algo` what every SAC-family variant holds, built around the networks it made (in the
    order given, which is the order their weights were drawn in): `policy`, `critic` and its slow
    `critic_target`, BAC's `value` (or None), `log_alpha` and `target_entropy`, `reward_norm`, a
    gradient step for each (`project(module, taken)` after every step of a network, for SimbaV2's
    hyperspherical weights), one lr `schedule` over them all, and `policy_ddp` and `critics` (with
    several learners DDP averages the online modules' gradients; targets and normalizers stay plain)."""
    algo.cfg, algo.generator, device, generator = cfg, setup.generator, setup.device, setup.generator
    algo.policy, algo.critic = policy.to(device), critic.to(device)
    # the target draws DroQ's dropout masks from the same generator, not from a copy of it
    algo.critic_target = copy.deepcopy(algo.critic, memo={id(generator): generator}).requires_grad_(False)
    algo.value = value.to(device) if value is not None else None
    algo.log_alpha, algo.target_entropy = temperature(cfg, act_dim, device)
    algo.reward_norm = reward_norm.to(device)

    def step(module: nn.Module, lr: float) -> GradientStep:
        return GradientStep(
            make_optimizer(module, cfg.optimizer, lr), cfg.max_grad_norm, cfg.precision, device,
            project=partial(project, module) if project is not None else None,
        )

    algo.actor_step, algo.critic_step = step(algo.policy.actor, cfg.actor_lr), step(algo.critic, cfg.critic_lr)
    algo.alpha_step = GradientStep(fused_adam([algo.log_alpha], cfg.alpha_lr), cfg.max_grad_norm, cfg.precision, device,
                                   average_grads=True)
    algo.value_step = step(algo.value, cfg.critic_lr) if algo.value is not None else None
    steps = every_group(algo.actor_step, algo.critic_step, algo.alpha_step, algo.value_step)
    algo.schedule = LinearLRSchedule(steps, cfg.lr_end_fraction, setup.planned_steps)
    algo.largest_value = torch.zeros(())
    algo.policy_ddp = ddp.wrap(algo.policy)
    algo.critics = Critics(
        algo.critic, ddp.wrap(algo.critic), algo.critic_target, algo.critic_step,
        algo.value, ddp.wrap(algo.value) if algo.value is not None else None, algo.value_step,
    )


def checkpoint_parts(algo: Any) -> dict[str, Any]:
    """What `assemble_` gave `algo`, under the checkpoint keys every SAC-family variant uses."""
    parts = {
        "policy": algo.policy, "critic": algo.critic, "critic_target": algo.critic_target,
        "reward_norm": algo.reward_norm, "actor_step": algo.actor_step, "critic_step": algo.critic_step,
        "alpha_step": algo.alpha_step, "log_alpha": algo.log_alpha,
    }
    if algo.value is not None:
        parts |= {"value": algo.value, "value_step": algo.value_step}
    return parts | {"steps_done": algo.schedule}


def critics_then_actor(algo: Any, batch: Batch) -> dict[str, Tensor]:
    """SAC's fleet step (sac, droq): `batch.num_batches` critic (and V) steps, then the actor and
    temperature on the last batch."""
    alpha = algo.log_alpha.detach().exp()
    for i in range(batch.num_batches):
        info, q = update_scalar_critics(
            prepare(batch.at(i), algo.policy, algo.reward_norm), alpha, algo.policy, algo.generator, algo.critics,
            algo.reward_norm.scale(), algo.cfg,
        )
    info |= update_actor_and_temperature(
        batch.at(-1).obs, algo.policy, algo.policy_ddp, algo.generator, algo.critic, lambda q: q, algo.actor_step,
        algo.log_alpha, algo.alpha_step, algo.target_entropy, algo.cfg,
    )
    algo.largest_value = q.abs().max()
    info[m.ACTOR_LR] = algo.schedule.current_lr()
    algo.schedule.advance()
    return info


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
    x: Prepared, alpha: Tensor, policy: SquashedGaussianPolicy, generator: torch.Generator, critics: Critics, cfg
) -> dict[str, Tensor]:
    """BAC: V(s) regresses on an upper expectile of min Q'(s, a_replay) - alpha log pi(a~|s), the
    value of the best actions the buffer has seen rather than the current policy's."""
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            _, log_prob = policy(x.raw.obs, generator)
            target = soft_value_target(critics.target(x.obs, x.raw.action), log_prob, alpha)
        v = critics.value_ddp(x.obs)
    v_loss = expectile_loss(v, target, cfg.v_quantile)
    grad_norm = critics.value_step(v_loss)
    return {
        "critic/v_loss": v_loss.detach(), "critic/q_upper": v.detach().float().mean(), "critic/v_grad_norm": grad_norm
    }


def update_scalar_critics(
    x: Prepared, alpha: Tensor, policy: SquashedGaussianPolicy, generator: torch.Generator, critics: Critics,
    reward_scale: Tensor, cfg,
) -> tuple[dict[str, Tensor], Tensor]:
    """One critic step of SAC (BAC's V first, when learned): the soft target from the slow critics
    with clipped double-Q, mixed by BEE with r + bootstrap V(s'), then polyak. Returns the
    diagnostics (RLPD's included) and the online Q values (C, B)."""
    info = update_value(x, alpha, policy, generator, critics, cfg) if critics.value is not None else {}
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            next_action, next_log_prob = policy(x.raw.next_obs, generator)
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
    x: Prepared, alpha: Tensor, policy: SquashedGaussianPolicy, generator: torch.Generator, critics: Critics,
    support: Tensor, reward_scale: Tensor, cfg,
) -> tuple[dict[str, Tensor], Tensor]:
    """One critic step of distributional SAC: the pessimistic target critic's distribution of
    r + bootstrap (Z' - alpha log pi) projected on the support, cross-entropy, then polyak.
    Returns the diagnostics (RLPD's on E[Z]) and the online expected Q values (C, B)."""
    with autocast(x.obs.device, cfg.precision):
        with torch.no_grad():
            next_action, next_log_prob = policy(x.raw.next_obs, generator)
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
    generator: torch.Generator,  # the learner's: the actions' noise
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
        action, log_prob = policy_ddp(obs, generator)
        with frozen(critic):
            q = score(critic(policy.obs_norm(obs), action))
    actor_loss = sac_actor_loss(log_prob, q, alpha)
    grad_norm = actor_step(actor_loss)
    alpha_loss = temperature_loss(log_alpha, log_prob, target_entropy)
    if cfg.autotune_alpha:
        alpha_step(alpha_loss)
    return sac_actor_diagnostics(actor_loss, alpha, alpha_loss, log_prob, grad_norm)
