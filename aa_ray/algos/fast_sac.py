"""FastSAC: SAC with C51 critics for many parallel envs and large batches, FastTD3's recipe for SAC.

Reference: Seo, Sferrazza, Chen, Shi, Duan and Abbeel 2025, "Learning Sim-to-Real Humanoid
Locomotion in 15 Minutes" (arXiv 2512.01996), which introduces FastSAC beside FastTD3, and its
code (amazon-far/holosoma at fc600e7: `config_types/algo.py` FastSACConfig, `config_values/algo.py`
fast_sac, `agents/fast_sac/fast_sac.py` and `fast_sac_agent.py`), whose defaults are this config's:
AdamW lr 3e-4 with betas (0.9, 0.95) and weight decay 0.001, tau 0.125, an actor step every 4th
critic step, two critics of 768-384-192 and an actor of 512-256-128 with LayerNorm and SiLU, 101
atoms on [-20, 20], log std in [-5, 0], initial temperature 0.001 learned at 3e-4 toward a target
entropy of 0, observation normalization. How many envs, the batch (8,192), updates per env step
(`utd_ratio`, holosoma's `num_updates` 8), n-step (1) and gamma (0.97) are the spec's
(specs/fastsac*.yaml).

What differs from `sac_dist`, in the order of `update`:
- critic step on every batch: each slow critic's own distribution of r + bootstrap (Z'_i - alpha
  log pi(a'|s')) is projected on the support and its online critic learns it by cross-entropy:
  no clipped double-Q (the two critics are an ensemble, `num_q_networks` 2 in holosoma);
- temperature step right after every critic step, on that step's log pi(a'|s');
- polyak of the slow critics after every critic step;
- actor step after every `policy_delay`-th critic step (counted over the run), on that step's
  batch: E[alpha log pi(a|s) - mean_i E[Z_i(s, a)]], the critics' *mean*, not their min;
- networks: Linear -> LayerNorm -> SiLU blocks (`layer_norm: false` drops the norms), the actor's
  mean and log-std heads start at zero (first actions at the middle of the box, std e^-2.5).

Deliberate choices:
- holosoma's temperature optimizer is torch's AdamW with its default weight decay (0.01), which
  pulls log alpha toward 0 (alpha toward 1); here the temperature takes Adam with the same betas and
  no decay, the decay being meant for network weights;
- the two critics are one batched ensemble, as every aa-ray critic pair is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, Literal

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos import sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.config import C51Support, LearningRates, OffPolicyKnobs, RLPDKnobs, TemperatureKnobs
from aa_ray.algos.contexts import autocast, frozen
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.fast_td3 import project_each_critic
from aa_ray.algos.gradient_step import GradientStep, polyak_update_
from aa_ray.algos.losses import (
    categorical_cross_entropy,
    critic_diagnostics,
    rlpd_diagnostics,
    support_saturation,
    temperature_loss,
)
from aa_ray.algos.optimizers import tensor_lrs_
from aa_ray.algos.schedules import LinearLRSchedule, delayed_actor_steps, every_group
from aa_ray.nets.distributional import expected_value, make_support
from aa_ray.nets.mlp import EnsembleLayerNorm, EnsembleLinear, bounded_log_std
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.records import Batch, ObsDims


class FastSACConfig(OffPolicyKnobs, LearningRates, TemperatureKnobs, C51Support, RLPDKnobs):
    name: Literal["fast_sac"] = "fast_sac"
    tau: float = Field(0.125, gt=0, le=1, description="polyak rate of the slow critics, after every critic step")
    normalize_obs: bool = Field(True, description="running mean/std observation normalization")
    actor_lr: PositiveFloat = Field(3e-4, description="actor learning rate")
    critic_lr: PositiveFloat = Field(3e-4, description="critic learning rate")
    alpha_lr: PositiveFloat = Field(3e-4, description="temperature learning rate")
    init_alpha: PositiveFloat = Field(0.001, description="initial temperature")
    target_entropy_per_dim: float = Field(0.0, description="target entropy = this x |A| (unless target_entropy)")
    weight_decay: NonNegativeFloat = Field(0.001, description="AdamW's decoupled weight decay, actor and critics")
    adam_beta2: float = Field(0.95, gt=0, lt=1, description="Adam's second-moment decay for every optimizer")
    actor_hidden_dims: list[PositiveInt] = Field([512, 256, 128], min_length=1, description="actor MLP widths")
    critic_hidden_dims: list[PositiveInt] = Field([768, 384, 192], min_length=1, description="critic MLP widths")
    layer_norm: bool = Field(True, description="LayerNorm before each hidden SiLU, in the actor and the critics")
    log_std_min: float = Field(-5.0, description="the actor's smallest log std")
    log_std_max: float = Field(0.0, description="the actor's largest log std (std 1 at 0)")
    policy_delay: PositiveInt = Field(4, description="critic (and temperature) steps per actor step")

    @model_validator(mode="after")
    def _fast_sac_consistent(self) -> FastSACConfig:
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"algo.log_std_min ({self.log_std_min}) must be below algo.log_std_max ({self.log_std_max})"
            )
        if self.optimizer != "adam":
            raise ValueError("algo.optimizer: fast_sac trains with AdamW (algo.weight_decay); set optimizer: adam")
        return self


def norm_silu_layers(in_dim: int, hidden_dims: Sequence[int], layer_norm: bool) -> nn.Sequential:
    """Linear -> LayerNorm -> SiLU per hidden width (the LayerNorm left out without `layer_norm`)."""
    layers: list[nn.Module] = []
    for width in hidden_dims:
        layers += [nn.Linear(in_dim, width), nn.LayerNorm(width) if layer_norm else nn.Identity(), nn.SiLU()]
        in_dim = width
    return nn.Sequential(*layers)


class NormSiLUActor(nn.Module):
    """FastSAC's actor: LayerNorm-SiLU blocks, then a mean head and a log-std head that both start
    at zero; returns the pre-tanh mean and the log std squashed into [log_std_min, log_std_max]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], layer_norm: bool,
                 log_std_bounds: tuple[float, float]):
        super().__init__()
        self.body = norm_silu_layers(obs_dim, hidden_dims, layer_norm)
        self.mean = nn.Linear(hidden_dims[-1], act_dim)
        self.log_std = nn.Linear(hidden_dims[-1], act_dim)
        for head in (self.mean, self.log_std):  # every env starts from the same mean and a middling std
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        self.log_std_bounds = log_std_bounds

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        features = self.body(obs)
        return self.mean(features), bounded_log_std(self.log_std(features), *self.log_std_bounds)


class EnsembleNormSiLUCategoricalQ(nn.Module):
    """`num_critics` categorical critics on concat(obs, action) of LayerNorm-SiLU blocks, as one batched
    ensemble; forward returns logits (num_critics, batch, num_atoms)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dims: Sequence[int], num_atoms: int, num_critics: int,
                 layer_norm: bool):
        super().__init__()
        dims = [obs_dim + act_dim, *hidden_dims, num_atoms]
        self.layers = nn.ModuleList(
            EnsembleLinear(num_critics, d_in, d_out) for d_in, d_out in zip(dims[:-1], dims[1:], strict=True)
        )
        self.norms = nn.ModuleList(
            EnsembleLayerNorm(num_critics, width) if layer_norm else nn.Identity() for width in hidden_dims
        )
        self.num_critics = num_critics

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        x = torch.cat([obs, action], dim=-1).expand(self.num_critics, -1, -1)
        for layer, norm in zip(self.layers[:-1], self.norms, strict=True):
            x = nn.functional.silu(norm(layer(x)))
        return self.layers[-1](x)


def make_policy(cfg: FastSACConfig, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    actor = NormSiLUActor(obs.actor, act_dim, cfg.actor_hidden_dims, cfg.layer_norm,
                          (cfg.log_std_min, cfg.log_std_max))
    return SquashedGaussianPolicy(actor, obs, cfg.normalize_obs)


def adamw(params: Iterable[Tensor], lr: float, weight_decay: float, beta2: float) -> torch.optim.AdamW:
    """Fused AdamW with betas (0.9, beta2) and a tensor lr, as `training.fused_adam` builds Adam."""
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, beta2), fused=True)
    tensor_lrs_(optimizer)
    return optimizer


def mean_q_actor_loss(log_prob: Tensor, q: Tensor, alpha: Tensor) -> Tensor:
    """E[alpha log pi(a|s) - mean_i Q_i(s, a)], a ~ pi reparameterised; q (C, B)."""
    return (alpha * log_prob.float() - q.float().mean(dim=0)).mean()


class FastSAC(Bookkeeping):
    def __init__(self, cfg: FastSACConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        self.cfg, self.generator, device = cfg, setup.generator, setup.device
        self.policy = make_policy(cfg, obs, act_dim).to(device)
        self.critic = EnsembleNormSiLUCategoricalQ(
            obs.full, act_dim, cfg.critic_hidden_dims, cfg.num_atoms, num_critics=2, layer_norm=cfg.layer_norm
        ).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, device)
        self.log_alpha, self.target_entropy = sac_family.temperature(cfg, act_dim, device)
        self.reward_norm = sac_family.support_reward_normalizer(cfg, cfg.normalize_reward).to(device)
        self.critic_updates = 0  # decides the delayed actor steps; checkpointed

        optimizer = partial(adamw, weight_decay=cfg.weight_decay, beta2=cfg.adam_beta2)
        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(optimizer(self.policy.actor.parameters(), cfg.actor_lr))
        self.critic_step = step(optimizer(self.critic.parameters(), cfg.critic_lr))
        self.alpha_step = step(adamw([self.log_alpha], cfg.alpha_lr, 0.0, cfg.adam_beta2), average_grads=True)
        groups = every_group(self.actor_step, self.critic_step, self.alpha_step)
        self.schedule = LinearLRSchedule(groups, cfg.lr_end_fraction, setup.planned_steps)
        self.largest_value = torch.zeros(())

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic and temperature steps; after every `policy_delay`-th
        critic step (counted over the whole run), an actor step on the same batch."""
        info, self.critic_updates = delayed_actor_steps(
            batch, self.critic_updates, self.cfg.policy_delay, self.critic_and_temperature_update, self.actor_update
        )
        info[m.ACTOR_LR] = self.schedule.current_lr()
        self.schedule.advance()
        return info

    def critic_and_temperature_update(self, b: Batch) -> dict[str, Tensor]:
        cfg, x = self.cfg, sac_family.prepare(b, self.policy, self.reward_norm)
        alpha = self.log_alpha.detach().exp()
        with autocast(x.obs.device, cfg.precision):
            with torch.no_grad():
                next_action, next_log_prob = self.policy(b.next_obs, self.generator)
                next_probs = torch.softmax(self.critic_target(x.next_obs, next_action).float(), dim=-1)  # (C, B, N)
                # the soft term folded into the reward: atoms r - bootstrap alpha log pi + bootstrap z_j
                soft_reward = x.reward - x.bootstrap * alpha * next_log_prob.float()
                target_probs = project_each_critic(next_probs, soft_reward, x.bootstrap, self.support)
            logits = self.critic_ddp(x.obs, b.action)  # (C, B, N)
        q_loss = categorical_cross_entropy(logits, target_probs)
        grad_norm = self.critic_step(q_loss)
        # the temperature follows the entropy of the actions the target was built on
        alpha_loss = temperature_loss(self.log_alpha, next_log_prob, self.target_entropy)
        if cfg.autotune_alpha:
            self.alpha_step(alpha_loss)
        polyak_update_(self.critic, self.critic_target, cfg.tau)
        with torch.no_grad():
            q = expected_value(logits.detach(), self.support)  # (C, B)
            self.largest_value = q.abs().max()
            info = critic_diagnostics(q, q_loss, (target_probs * self.support).sum(-1), grad_norm,
                                      self.reward_norm.scale())
            info |= support_saturation(next_probs, soft_reward, x.bootstrap, self.support)
        info |= {m.ACTOR_ALPHA: alpha, "actor/alpha_loss": alpha_loss.detach()}
        return info | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio)

    def actor_update(self, b: Batch) -> dict[str, Tensor]:
        """The SAC actor step against the critics' mean expected value, the critics frozen."""
        alpha = self.log_alpha.detach().exp()
        with autocast(b.obs.device, self.cfg.precision):
            action, log_prob = self.policy_ddp(b.obs, self.generator)
            with frozen(self.critic):
                q = expected_value(self.critic(self.policy.obs_norm(b.obs), action), self.support)  # (C, B)
        actor_loss = mean_q_actor_loss(log_prob, q, alpha)
        grad_norm = self.actor_step(actor_loss)
        return {
            m.ACTOR_LOSS: actor_loss.detach(),
            m.ACTOR_ENTROPY: -log_prob.detach().float().mean(),
            "actor/grad_norm": grad_norm,
            "actor/action_saturation": (action.detach().abs() > 0.99).float().mean(),
        }

    def parts(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
            "alpha_step": self.alpha_step, "log_alpha": self.log_alpha, "steps_done": self.schedule,
        }

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critic_updates = int(state["critic_updates"])
