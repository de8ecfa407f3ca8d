"""Proximal Policy Optimization for continuous actions, on-policy (no replay).

References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv 1707.06347) for
the clipped surrogate; Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation" (arXiv 1506.02438); Xie et al. 2024, "Simple Policy Optimization" (SPO,
arXiv 2401.16025) for the quadratic-penalty alternative to clipping; the adaptive learning rate
from a KL target as in rsl_rl. Deliberate choices:
- env runners return `train_every` steps per env with the sampled (unclipped) action, its
  log-probability under the acting policy, V(s) and V(s') where s' is the *true* next observation
  (the final one at a truncation), so a time limit bootstraps instead of looking like a terminal;
- observation and reward normalizers stay frozen during the update and take the rollout's
  statistics afterwards (the learner merges them), so the first ratio of every update is exactly 1;
- advantages are normalized over the global batch (all learners), each learner updates on its own
  envs' share, and DDP averages the gradients;
- the adaptive learning rate changes the actor's rate only (`kl_adapts: both`: the critic's too, one
  rate for both as in rsl_rl), on the KL averaged over learners, so every learner keeps the same rate;
  the rule runs on the device (`adapt_lr`, a `torch.where` on the KL tensor), so the update never
  waits for the host;
- symmetry augmentation (`sym_aug`, as in rsl_rl): each minibatch is doubled with its mirror image
  (observations and actions mirrored before normalization; old log-probs, advantages and value
  targets copied), and `actor/symmetry_loss` pulls the mean action of a mirrored observation toward
  the mirror of the original's (a detached target). The KL and clip fractions are measured on the
  original rows only: only there is the ratio an importance ratio of the acting policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.config import LearningRates, OnPolicyKnobs
from aa_ray.algos.contract import Health, RunShape, TrainingSetup
from aa_ray.algos.gradient_step import count_skip_, step_if_
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.optimizers import fused_adam
from aa_ray.algos.schedules import LinearLRSchedule
from aa_ray.nets.actor_critic import GaussianActorCritic
from aa_ray.records import ObsDims, Rollout

if TYPE_CHECKING:  # for the type only: importing aa_ray.envs loads MuJoCo, which validating a spec must not need
    from aa_ray.envs.symmetry import Mirror


class PPOConfig(OnPolicyKnobs, LearningRates):
    name: Literal["ppo"] = "ppo"
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    ppo_epochs: PositiveInt = Field(4, description="passes over each rollout")
    num_minibatches: PositiveInt = Field(4, description="minibatches per pass (per learner)")
    actor_lr: PositiveFloat = Field(3e-4, description="Adam learning rate of the actor (the start, with desired_kl)")
    critic_lr: PositiveFloat = Field(3e-4, description="Adam learning rate of the critic")
    clip_param: PositiveFloat | tuple[PositiveFloat, PositiveFloat] = Field(
        0.2, description="ratio clip epsilon, or [eps_low, eps_high] for an asymmetric clip"
    )
    spo: bool = Field(False, description="SPO's quadratic penalty instead of clipping (eps = the upper clip)")
    value_coef: PositiveFloat = Field(1.0, description="weight of the value loss")
    entropy_coef: NonNegativeFloat = Field(0.0, description="weight of the entropy bonus")
    max_grad_norm: PositiveFloat | None = Field(1.0, description="clip actor and critic gradients to this norm")
    desired_kl: PositiveFloat | None = Field(0.01, description="adapt the actor's lr toward this KL (null: fixed lr)")
    kl_adapts: Literal["actor", "both"] = Field(
        "actor", description="which learning rates desired_kl adapts: the actor's, or both (rsl_rl: one rate for "
        "the actor and the critic, starting at actor_lr)"
    )
    lr_bounds: tuple[PositiveFloat, PositiveFloat] = Field((1e-5, 1e-2), description="range of the adaptive lr")
    init_log_std: float = Field(0.0, description="initial log std of the Gaussian policy")
    actor_hidden_dims: list[PositiveInt] = Field([64, 64], min_length=1, description="actor MLP widths")
    critic_hidden_dims: list[PositiveInt] = Field([64, 64], min_length=1, description="critic MLP widths")
    clip_actions: bool = Field(
        True, description="clip the Gaussian's samples and mean to the env's action bounds before the env takes "
        "them; false: the env takes them as they are, as rsl_rl's runners do (for envs whose bounds are a scale, "
        "not a limit: UniLab's and Isaac Lab's joint-position offsets)"
    )
    activation: Literal["tanh", "elu"] = Field(
        "tanh", description="the MLPs' activation: tanh (CleanRL, SB3) or elu (rsl_rl's locomotion recipes)"
    )
    normalize_obs: bool = Field(True, description="running mean/std observation normalization")
    normalize_reward: bool = Field(True, description="scale rewards by the running std of the return")
    sym_aug: bool = Field(
        False,
        description="symmetry augmentation: every minibatch doubled with its mirror image (aa_ray/envs/symmetry.py) "
        "plus the symmetry loss; the env must have a mirror",
    )
    symmetry_coef: NonNegativeFloat = Field(
        1.0, description="weight of actor/symmetry_loss with sym_aug (0: the mirrored minibatch alone, the loss logged)"
    )

    @field_validator("clip_param")
    @classmethod
    def _clip_below_one(cls, value: float | tuple[float, float]) -> float | tuple[float, float]:
        low = value[0] if isinstance(value, tuple) else value
        if low >= 1:
            raise ValueError("the lower clip epsilon must be below 1 (ratios are positive)")
        return value

    @model_validator(mode="after")
    def _one_rule_for_the_actor_lr(self) -> PPOConfig:
        if self.desired_kl is not None and self.lr_end_fraction != 1.0:
            raise ValueError(
                "lr_end_fraction < 1 schedules the lrs, but desired_kl already adapts the actor's lr: "
                "set desired_kl: null to schedule, or lr_end_fraction: 1.0 to adapt"
            )
        return self

    @property
    def updates_per_iteration(self) -> int:
        return self.ppo_epochs * self.num_minibatches

    def check_run(self, run: RunShape) -> None:
        super().check_run(run)
        rows = self.rollout_rows_per_learner(run)
        if rows < self.num_minibatches:
            raise ValueError(
                f"algo.num_minibatches ({self.num_minibatches}) exceeds the rollout rows per learner "
                f"({rows} = algo.train_every x envs / learners)"
            )

    @property
    def clip_range(self) -> tuple[float, float]:
        return self.clip_param if isinstance(self.clip_param, tuple) else (self.clip_param, self.clip_param)


def make_policy(cfg: PPOConfig, obs: ObsDims, act_dim: int) -> GaussianActorCritic:
    return GaussianActorCritic(
        obs, act_dim, cfg.actor_hidden_dims, cfg.critic_hidden_dims, cfg.normalize_obs, cfg.init_log_std,
        cfg.activation, cfg.clip_actions,
    )


def gae(
    reward: Tensor, value: Tensor, next_value: Tensor, terminated: Tensor, truncated: Tensor,
    gamma: float, lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimates and value targets over (time, envs).

    delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t); A_t = delta_t + gamma lam (1 - done_t) A_{t+1}.
    Only a terminal masks the bootstrap; any episode end (terminal or time limit) stops the
    recursion, because the next row of that env belongs to a new episode."""
    delta = reward + gamma * (1.0 - terminated) * next_value - value
    continues = 1.0 - torch.maximum(terminated, truncated)
    advantages = torch.zeros_like(reward)
    running = torch.zeros_like(reward[0])
    for t in reversed(range(reward.shape[0])):
        running = delta[t] + gamma * lam * continues[t] * running
        advantages[t] = running
    return advantages, advantages + value


def clipped_surrogate_loss(ratio: Tensor, advantage: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """-E[min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)]."""
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(ratio * advantage, clipped * advantage).mean()


def spo_loss(ratio: Tensor, advantage: Tensor, eps: float) -> Tensor:
    """SPO: -E[r A - |A| (r - 1)^2 / (2 eps)]; the penalty pulls the ratio back smoothly instead of
    cutting the gradient off at the clip boundary."""
    return -(ratio * advantage - advantage.abs() * (ratio - 1.0).pow(2) / (2.0 * eps)).mean()


def adapt_lr(lr: Tensor, kl: Tensor, desired_kl: float, bounds: tuple[float, float]) -> Tensor:
    """Shrink the step when the policy moved too far (KL > 2 x target), grow it when it barely moved
    (on the device: the lr is a tensor the fused optimizer reads)."""
    shrunk, grown = (lr / 1.5).clamp_min(bounds[0]), (lr * 1.5).clamp_max(bounds[1])
    return torch.where(kl > 2.0 * desired_kl, shrunk, torch.where(kl < 0.5 * desired_kl, grown, lr))


def symmetry_loss(mean: Tensor, mirrored_mean: Tensor, mirror: Mirror) -> Tensor:
    """E[(mu(mirror(s)) - mirror(mu(s)))^2]: 0 when the policy acts mirrored on mirrored states; the
    original's mirrored mean is the (detached) target."""
    return (mirrored_mean - mirror.action(mean).detach()).pow(2).mean()


def explained_variance(prediction: Tensor, target: Tensor) -> Tensor:
    """1 - Var(target - prediction) / Var(target): 1 is perfect, 0 is no better than the mean (nan
    for a constant target)."""
    variance = target.var()
    explained = 1.0 - (target - prediction).var() / variance
    return torch.where(variance > 0, explained, torch.full_like(explained, float("nan")))


class PPO(Bookkeeping):
    def __init__(
        self, cfg: PPOConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup, mirror: Mirror | None = None
    ):
        if cfg.sym_aug and mirror is None:
            raise ValueError("algo.sym_aug: PPO needs the env's mirror (aa_ray.envs.symmetry.sym_aug_mirror)")
        self.cfg, self.device, self.generator = cfg, setup.device, setup.generator
        device = setup.device
        self.mirror = mirror if cfg.sym_aug else None
        self.policy = make_policy(cfg, obs, act_dim).to(device)
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(device)
        # param_groups[0] is the actor (its lr adapts to the KL), [1] the critic (adapted too with kl_adapts: both)
        self.adapted_groups = 0 if cfg.desired_kl is None else (2 if cfg.kl_adapts == "both" else 1)
        critic_lr = cfg.actor_lr if self.adapted_groups == 2 else cfg.critic_lr
        self.optimizer = fused_adam([
            {"params": self.policy.actor.parameters(), "lr": cfg.actor_lr},
            {"params": self.policy.critic.parameters(), "lr": critic_lr},
        ], cfg.actor_lr)
        scheduled = [(self.optimizer, group) for group in range(self.adapted_groups, 2)]
        self.schedule = LinearLRSchedule(scheduled, cfg.lr_end_fraction, setup.planned_steps)
        # several learners: DDP averages the actor's and critic's gradients; the normalizers stay plain
        self.actor_ddp, self.critic_ddp = ddp.wrap(self.policy.actor), ddp.wrap(self.policy.critic)
        # minibatch steps skipped for a non-finite loss or gradient (device counters, see GradientStep)
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.consecutive_skips = torch.zeros((), dtype=torch.int64, device=device)
        self.largest_value = torch.zeros(())

    def update(self, rollout: Rollout) -> dict[str, Tensor]:
        cfg = self.cfg
        # 1. advantages from the rollout's values, on rewards scaled by the (frozen) return std
        reward = self.reward_norm(rollout.reward)
        advantages, returns = gae(
            reward, rollout.value, rollout.next_value, rollout.terminated, rollout.truncated, cfg.gamma, cfg.gae_lambda
        )
        adv_mean, adv_std = ddp.global_mean_std(advantages)
        normalized = (advantages - adv_mean) / adv_std.clamp_min(1e-7)

        # 2. epochs x minibatches over the flattened (time, env) rows
        raw_obs, action = rollout.obs.flatten(0, 1), rollout.action.flatten(0, 1)
        rows = [
            self.policy.obs_norm(raw_obs), action, rollout.log_prob.flatten(), normalized.flatten(), returns.flatten()
        ]
        if self.mirror is not None:  # sym_aug: each row's mirror image (mirrored before normalizing)
            rows += [self.policy.obs_norm(self.mirror.obs(raw_obs)), self.mirror.action(action)]
        totals: dict[str, Tensor] = {}
        self.largest_value = torch.zeros((), device=self.device)
        for _ in range(cfg.ppo_epochs):
            for index in torch.randperm(len(action), generator=self.generator, device=self.device).chunk(
                cfg.num_minibatches
            ):
                info = self.update_minibatch(*(column[index] for column in rows))
                if cfg.desired_kl is not None:
                    lr = adapt_lr(self.optimizer.param_groups[0]["lr"], info["actor/approx_kl"], cfg.desired_kl,
                                  cfg.lr_bounds)
                    for group in self.optimizer.param_groups[:self.adapted_groups]:
                        group["lr"].copy_(lr)
                for key, value in info.items():
                    totals[key] = totals.get(key, 0.0) + value
        minibatches = cfg.ppo_epochs * cfg.num_minibatches
        info = {key: value / minibatches for key, value in totals.items()}
        self.schedule.advance(cfg.train_every)  # one rollout is train_every fleet steps

        # 3. diagnostics of the data the update learned from
        return info | {
            m.ACTOR_LR: self.optimizer.param_groups[0]["lr"].detach().clone(),
            "actor/std": self.policy.actor.log_std.detach().exp().mean(),
            "critic/explained_var": explained_variance(rollout.value, returns),
            "critic/adv_mean": adv_mean,
            "critic/adv_std": adv_std,
            "critic/value_mean": rollout.value.mean(),
            "critic/return_mean": returns.mean(),
            "critic/reward_scale": self.reward_norm.scale(),
        }

    def update_minibatch(
        self, obs: Tensor, action: Tensor, old_log_prob: Tensor, advantage: Tensor, value_target: Tensor,
        mirrored_obs: Tensor | None = None, mirrored_action: Tensor | None = None,
    ) -> dict[str, Tensor]:
        eps_low, eps_high = self.cfg.clip_range
        rows = len(action)
        if mirrored_obs is not None:  # sym_aug: [rows; their mirror images], which share log-probs and targets
            obs, action = torch.cat([obs, mirrored_obs]), torch.cat([action, mirrored_action])
            old_log_prob, advantage, value_target = (torch.cat([x, x]) for x in (old_log_prob, advantage, value_target))
        log_prob, entropy, mean = self.actor_ddp(obs[..., : self.policy.actor_features], action)
        log_ratio = log_prob - old_log_prob
        ratio = log_ratio.exp()
        if self.cfg.spo:
            policy_loss = spo_loss(ratio, advantage, eps_high)
        else:
            policy_loss = clipped_surrogate_loss(ratio, advantage, eps_low, eps_high)
        value = self.critic_ddp(obs)
        value_loss = (value - value_target).pow(2).mean()
        loss = policy_loss - self.cfg.entropy_coef * entropy.mean() + self.cfg.value_coef * value_loss
        extra: dict[str, Tensor] = {}
        if self.mirror is not None:
            mirror_gap = symmetry_loss(mean[:rows], mean[rows:], self.mirror)
            loss = loss + self.cfg.symmetry_coef * mirror_gap
            extra["actor/symmetry_loss"] = mirror_gap.detach()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        actor_norm = self._clip(self.policy.actor)
        critic_norm = self._clip(self.policy.critic)
        # skipped on the device unless finite, as in GradientStep (every learner sees the same all-reduced gradients)
        taken = torch.isfinite(actor_norm + critic_norm) & torch.isfinite(loss.detach())
        count_skip_(self.skipped, self.consecutive_skips, taken)
        step_if_(self.optimizer, taken)

        with torch.no_grad():
            ratio, log_ratio = ratio[:rows], log_ratio[:rows]  # the acting policy's rows (not their mirror images)
            approx_kl = ddp.global_mean(((ratio - 1.0) - log_ratio).mean())  # Schulman's k3 estimator, >= 0
            self.largest_value = torch.maximum(self.largest_value, value.abs().max())
        return extra | {
            m.ACTOR_LOSS: policy_loss.detach(),
            m.ACTOR_ENTROPY: entropy.detach().mean(),
            "actor/approx_kl": approx_kl,
            "actor/clamp_pos": (ratio > 1.0 + eps_high).float().mean(),
            "actor/clamp_neg": (ratio < 1.0 - eps_low).float().mean(),
            "actor/grad_norm": actor_norm,
            "critic/value_loss": value_loss.detach(),
            "critic/grad_norm": critic_norm,
        }

    def _clip(self, module: nn.Module) -> Tensor:
        limit = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else float("inf")
        return nn.utils.clip_grad_norm_(module.parameters(), limit).detach()

    def health(self) -> Health:
        return Health(self.skipped, self.consecutive_skips, self.largest_value)

    def parts(self) -> dict[str, Any]:
        # the optimizer's state includes the adapted lr
        return {
            "policy": self.policy, "reward_norm": self.reward_norm, "optimizer": self.optimizer,
            "steps_done": self.schedule,
        }
