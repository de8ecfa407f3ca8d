"""FastTD3: TD3 with a distributional (C51) critic, made for many parallel envs and large batches.

Reference: Seo, Sferrazza, Geng, Nauman, Yin and Abbeel 2025, "FastTD3: Simple, Fast, and Capable
Reinforcement Learning for Humanoid Control" (arXiv 2505.22642), and the authors' code
(younggyoseo/FastTD3 at 229ed59: `fast_td3/fast_td3.py`, `train.py`, `hyperparams.py`), whose
defaults are this config's: AdamW lr 3e-4 with weight decay 0.1 for actor and critic, tau 0.1,
target noise 0.001 clipped at 0.5, an actor step every 2nd critic step, a ReLU critic of
1024-512-256 with 101 atoms, a ReLU actor of 512-256-128 whose output layer starts at N(0, 0.01),
observation normalization, and per-env exploration noise scales from [0.001, 0.4]. How many envs,
the batch (32,768 in the paper), updates per env step (`utd_ratio`, the paper's `num_updates` 2),
n-step (1 to 8) and gamma (0.99, 0.97 on Playground) are the spec's (specs/fasttd3*.yaml).

The update, in the order of `update`:
- critic step on every batch: a' = mu(s') + clip(N(0, 0.001^2), +-0.5) from the *online* actor
  (FastTD3 keeps no target actor); each slow critic's distribution of Z'(s', a'); clipped double-Q
  on distributions: per sample, the slow critic whose distribution has the lower mean is projected
  onto the support as r + bootstrap * z_j (C51), and both online critics learn it by cross-entropy;
  then polyak of the slow critics, after every critic step (not delayed as in TD3);
- actor step after every `policy_delay`-th critic step (counted over the run), on that step's
  batch: maximise min over the two critics of E[Z(s, mu(s))].
With `clipped_double_q: false` (the paper's `use_cdq`, off for its LeapCube tasks) each critic
learns the projection of its own slow copy and the actor maximises the critics' mean.

Deliberate choices:
- the pessimistic critic is chosen by the mean of its next-state distribution and projected once
  (`losses.pessimistic_distribution`); FastTD3 projects both and compares the projected means. The
  projection keeps a distribution's mean, r + bootstrap E[Z'], unless atoms fall off the support, so
  both pick the same critic except where the support clips (see critic/support_saturation_*);
- exploration: env copy i of a runner's E explores with the noise std
  low + (high - low) (i + 1/2) / E, an even spread over FastTD3's range, fixed for the run.
  FastTD3 draws each env's std at random and redraws it when the env's episode ends; a runner
  does not tell its policy when episodes end, and the spread needs no state, so a resumed run acts
  exactly as the uninterrupted one would. Over the fleet the stds cover the same range;
- the two critics are one batched ensemble (`EnsembleCategoricalQ`), as in `sac_dist`.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Literal

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.config import C51Support, LearningRates, MLPNetworks, OffPolicyKnobs, RLPDKnobs
from aa_ray.algos.contexts import autocast, frozen
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.gradient_step import GradientStep, polyak_update_
from aa_ray.algos.losses import (
    bootstrap_factor,
    categorical_cross_entropy,
    critic_diagnostics,
    pessimistic_distribution,
    rlpd_diagnostics,
    smoothed_target_action,
    support_saturation,
)
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.optimizers import fused_adam
from aa_ray.algos.schedules import LinearLRSchedule, delayed_actor_steps, every_group
from aa_ray.nets.deterministic import DeterministicPolicy
from aa_ray.nets.distributional import EnsembleCategoricalQ, expected_value, make_support, project_distribution
from aa_ray.nets.mlp import mlp
from aa_ray.nets.policy import Array, acting_input, as_given
from aa_ray.records import Batch, ObsDims


class FastTD3Config(OffPolicyKnobs, LearningRates, C51Support, RLPDKnobs, MLPNetworks):
    name: Literal["fast_td3"] = "fast_td3"
    tau: float = Field(0.1, gt=0, le=1, description="polyak rate of the slow critics, after every critic step")
    normalize_obs: bool = Field(True, description="running mean/std observation normalization")
    actor_lr: PositiveFloat = Field(3e-4, description="actor learning rate")
    critic_lr: PositiveFloat = Field(3e-4, description="critic learning rate")
    weight_decay: NonNegativeFloat = Field(0.1, description="AdamW's decoupled weight decay, actor and critic")
    actor_hidden_dims: list[PositiveInt] = Field([512, 256, 128], min_length=1, description="actor MLP widths")
    critic_hidden_dims: list[PositiveInt] = Field([1024, 512, 256], min_length=1, description="critic MLP widths")
    actor_output_init_std: PositiveFloat = Field(
        0.01, description="the actor's output layer starts at N(0, this^2) with zero bias: near-zero first actions"
    )
    policy_delay: PositiveInt = Field(2, description="critic steps per actor step")
    clipped_double_q: bool = Field(
        True,
        description="target from the slow critic with the lower mean, actor on the critics' min; false: each "
        "critic learns its own slow copy's target and the actor the critics' mean",
    )
    target_noise: NonNegativeFloat = Field(0.001, description="std of the Gaussian noise on the target action")
    target_noise_clip: NonNegativeFloat = Field(0.5, description="target noise is clipped to +-this")
    exploration_noise_min: NonNegativeFloat = Field(0.001, description="smallest env copy's exploration noise std")
    exploration_noise_max: NonNegativeFloat = Field(0.4, description="largest env copy's exploration noise std")

    @model_validator(mode="after")
    def _fast_td3_consistent(self) -> FastTD3Config:
        if self.exploration_noise_min > self.exploration_noise_max:
            raise ValueError(
                f"algo.exploration_noise_min ({self.exploration_noise_min}) must not exceed "
                f"algo.exploration_noise_max ({self.exploration_noise_max})"
            )
        if self.optimizer != "adam":
            raise ValueError("algo.optimizer: fast_td3 trains with AdamW (algo.weight_decay); set optimizer: adam")
        return self


def spread_noise_scales(num_envs: int, low: float, high: float) -> Tensor:
    """One exploration noise std per env copy, evenly spread over [low, high]: (num_envs, 1)."""
    fractions = (torch.arange(num_envs, dtype=torch.float32) + 0.5) / num_envs
    return (low + (high - low) * fractions).unsqueeze(-1)


class PerEnvNoisePolicy(DeterministicPolicy):
    """FastTD3's acting module: tanh(actor(normalized obs)); exploring, row i of the observations
    (env copy i) adds Gaussian noise of its own std (`spread_noise_scales`), clipped to [-1, 1]."""

    def __init__(self, actor: nn.Module, obs: ObsDims, normalize_obs: bool, noise_min: float, noise_max: float):
        super().__init__(actor, obs, normalize_obs, exploration_noise=noise_max)
        self.noise_range = (noise_min, noise_max)  # plain numbers: the weights a checkpoint holds do not change
        self._scales: dict[tuple[int, torch.device], Tensor] = {}  # made once per (envs, device): no copy per step

    @torch.no_grad()
    def act(self, obs: Array, deterministic: bool, generator: torch.Generator | None = None) -> Array:
        """Actions in [-1, 1] for raw observations (E, features), numpy or a tensor (`as_given`)."""
        action = self(acting_input(obs))
        if deterministic or self.noise_range[1] == 0:
            return as_given(action, obs)
        key = (action.shape[0], action.device)
        if key not in self._scales:
            self._scales[key] = spread_noise_scales(action.shape[0], *self.noise_range).to(action.device)
        scales = self._scales[key]
        noise = torch.randn(action.shape, generator=generator, dtype=action.dtype, device=action.device)
        return as_given((action + scales * noise).clamp(-1.0, 1.0), obs)


def make_policy(cfg: FastTD3Config, obs: ObsDims, act_dim: int) -> PerEnvNoisePolicy:
    actor = mlp(obs.actor, cfg.actor_hidden_dims, act_dim)  # pre-tanh action
    # small first actions: the policy starts near the middle of the action box
    nn.init.normal_(actor[-1].weight, 0.0, cfg.actor_output_init_std)
    nn.init.zeros_(actor[-1].bias)
    return PerEnvNoisePolicy(actor, obs, cfg.normalize_obs, cfg.exploration_noise_min, cfg.exploration_noise_max)


def project_each_critic(next_probs: Tensor, reward: Tensor, bootstrap: Tensor, support: Tensor) -> Tensor:
    """C51's projection of every slow critic's own distribution of r + bootstrap * Z', (C, B, N) ->
    (C, B, N): the targets when each critic learns from its own slow copy (no clipped double-Q)."""
    critics, rows, atoms = next_probs.shape
    flat = project_distribution(
        next_probs.reshape(critics * rows, atoms), reward.repeat(critics), bootstrap.repeat(critics), support
    )
    return flat.reshape(critics, rows, atoms)


def deterministic_policy_loss(q: Tensor, clipped_double_q: bool) -> Tensor:
    """-E[min_i Q_i(s, mu(s))] (or the critics' mean without clipped double-Q); q (C, B)."""
    judged = q.float().min(dim=0).values if clipped_double_q else q.float().mean(dim=0)
    return -judged.mean()


class FastTD3(Bookkeeping):
    def __init__(self, cfg: FastTD3Config, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        self.cfg, self.generator, device = cfg, setup.generator, setup.device
        self.policy = make_policy(cfg, obs, act_dim).to(device)
        self.critic = EnsembleCategoricalQ(
            obs.full, act_dim, cfg.critic_hidden_dims, cfg.num_atoms, num_critics=2, layer_norm=cfg.layer_norm
        ).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = make_support(cfg.num_atoms, cfg.v_min, cfg.v_max, device)
        # scaled returns of either sign fit the support when max|G| maps to its nearer end
        v_max = cfg.support_half_width() if cfg.normalize_reward else None
        self.reward_norm = RewardNormalizer(cfg.normalize_reward, v_max=v_max).to(device)
        self.critic_updates = 0  # decides the delayed actor steps; checkpointed

        adamw = partial(fused_adam, weight_decay=cfg.weight_decay)
        step = partial(GradientStep, max_grad_norm=cfg.max_grad_norm, precision=cfg.precision, device=device)
        self.actor_step = step(adamw(self.policy.actor.parameters(), cfg.actor_lr))
        self.critic_step = step(adamw(self.critic.parameters(), cfg.critic_lr))
        self.schedule = LinearLRSchedule(every_group(self.actor_step, self.critic_step), cfg.lr_end_fraction,
                                         setup.planned_steps)
        self.largest_value = torch.zeros(())

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic steps; after every `policy_delay`-th critic step
        (counted over the whole run), an actor step on the same batch."""
        info, self.critic_updates = delayed_actor_steps(
            batch, self.critic_updates, self.cfg.policy_delay, self.critic_update, self.actor_update
        )
        info[m.ACTOR_LR] = self.schedule.current_lr()
        self.schedule.advance()
        return info

    def critic_update(self, b: Batch) -> dict[str, Tensor]:
        cfg = self.cfg
        obs, next_obs = self.policy.obs_norm(b.obs), self.policy.obs_norm(b.next_obs)
        reward, bootstrap = self.reward_norm(b.reward), bootstrap_factor(b.discount, b.terminated)
        with autocast(obs.device, cfg.precision):
            with torch.no_grad():
                # target policy smoothing on the online actor's action: FastTD3 has no slow actor
                next_action = self.policy(b.next_obs).float()
                noise = ddp.randn_shard(next_action.shape, self.generator, next_action.dtype) * cfg.target_noise
                next_action = smoothed_target_action(next_action, noise, cfg.target_noise_clip)
                next_logits = self.critic_target(next_obs, next_action)  # (C, B, N)
                if cfg.clipped_double_q:
                    next_probs = pessimistic_distribution(next_logits, self.support)  # (B, N)
                    target_probs = project_distribution(next_probs, reward, bootstrap, self.support)
                else:
                    next_probs = torch.softmax(next_logits.float(), dim=-1)  # (C, B, N)
                    target_probs = project_each_critic(next_probs, reward, bootstrap, self.support)
            logits = self.critic_ddp(obs, b.action)  # (C, B, N)
        q_loss = categorical_cross_entropy(logits, target_probs)
        grad_norm = self.critic_step(q_loss)
        polyak_update_(self.critic, self.critic_target, cfg.tau)
        with torch.no_grad():
            q = expected_value(logits.detach(), self.support)  # (C, B)
            self.largest_value = q.abs().max()
            td_target = (target_probs * self.support).sum(-1)
            info = critic_diagnostics(q, q_loss, td_target, grad_norm, self.reward_norm.scale())
            info |= support_saturation(next_probs, reward, bootstrap, self.support)
        return info | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio)

    def actor_update(self, b: Batch) -> dict[str, Tensor]:
        """The deterministic policy gradient through the critics' expected values (min of the two)."""
        with autocast(b.obs.device, self.cfg.precision):
            action = self.policy_ddp(b.obs)
            with frozen(self.critic):
                q = expected_value(self.critic(self.policy.obs_norm(b.obs), action), self.support)  # (C, B)
        actor_loss = deterministic_policy_loss(q, self.cfg.clipped_double_q)
        grad_norm = self.actor_step(actor_loss)
        return {
            m.ACTOR_LOSS: actor_loss.detach(),
            "actor/grad_norm": grad_norm,
            "actor/action_saturation": (action.detach().abs() > 0.99).float().mean(),
            "actor/updates": torch.tensor(float(self.critic_updates // self.cfg.policy_delay)),
        }

    def parts(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "critic": self.critic, "critic_target": self.critic_target,
            "reward_norm": self.reward_norm, "actor_step": self.actor_step, "critic_step": self.critic_step,
            "steps_done": self.schedule,
        }

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critic_updates = int(state["critic_updates"])

