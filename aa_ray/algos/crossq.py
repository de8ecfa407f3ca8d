"""CrossQ: SAC without target networks, its critics and actor batch-renormalized.

Reference: Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for
Greater Sample Efficiency and Simplicity" (ICLR 2024); sbx's CrossQ for the defaults. Deliberate
choices, as in the paper:
- no target networks: the TD target bootstraps from the online critics, with a stop-gradient;
- (s, a) and (s', a' ~ pi(.|s')) go through the critics in one forward pass in training mode, so
  batch renormalization sees both distributions in one batch (the paper's "cross" batch);
- a' is sampled with the actor in evaluation mode (running statistics); the actor trains in
  training mode against the critics in evaluation mode;
- wide critics (2048 x 2), Adam with beta1 = 0.5, lr 1e-3, UTD 1, an actor and temperature step
  after every `policy_delay` (3) critic steps;
- batch renormalization (aa_ray/nets/batch_renorm.py) is plain batch normalization for the first
  `renorm_warmup_steps` forward passes of each layer.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from torch import Tensor

from aa_ray import metric_names as m
from aa_ray.algos import config, sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.contexts import autocast, evaluating
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.losses import bootstrap_factor, critic_diagnostics, rlpd_diagnostics, soft_td_target, td_loss
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.schedules import delayed_actor_steps
from aa_ray.nets.batch_renorm import RenormActor, RenormEnsembleQ, RenormSettings
from aa_ray.nets.policy import SquashedGaussianPolicy
from aa_ray.records import Batch, ObsDims


class CrossQConfig(config.OffPolicyKnobs, config.LearningRates, config.TemperatureKnobs, config.RLPDKnobs):
    name: Literal["crossq"] = "crossq"
    actor_lr: PositiveFloat = Field(1e-3, description="actor learning rate")
    critic_lr: PositiveFloat = Field(1e-3, description="critic learning rate")
    adam_beta1: float = Field(0.5, ge=0, lt=1, description="Adam's first-moment decay for every optimizer")
    actor_hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="actor MLP widths")
    critic_hidden_dims: list[PositiveInt] = Field([2048, 2048], min_length=1, description="critic MLP widths")
    policy_delay: PositiveInt = Field(3, description="critic steps per actor and temperature step")
    renorm_momentum: float = Field(0.01, gt=0, le=1, description="running statistics' update rate (1 - decay)")
    renorm_warmup_steps: int = Field(100_000, ge=0, description="forward passes of plain batch norm per layer first")

    @model_validator(mode="after")
    def _no_targets(self) -> CrossQConfig:
        if self.tau != type(self).model_fields["tau"].default:  # (a dumped spec holds the default: it round-trips)
            raise ValueError("algo.tau: CrossQ has no target networks, so no polyak rate; leave tau out")
        return self

    def renorm(self) -> RenormSettings:
        return RenormSettings(momentum=self.renorm_momentum, warmup_steps=self.renorm_warmup_steps)


def make_policy(cfg: CrossQConfig, obs: ObsDims, act_dim: int) -> SquashedGaussianPolicy:
    return SquashedGaussianPolicy(RenormActor(obs.actor, act_dim, cfg.actor_hidden_dims, cfg.renorm()), obs,
                                  cfg.normalize_obs)


class CrossQ(Bookkeeping):
    def __init__(self, cfg: CrossQConfig, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        # no slow critic; with several learners batch renormalization takes the global batch's moments
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim),
            critic=RenormEnsembleQ(obs.full, act_dim, cfg.critic_hidden_dims, cfg.renorm()),
            reward_norm=RewardNormalizer(cfg.normalize_reward), slow_critic=False, beta1=cfg.adam_beta1,
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())
        self.critic_updates = 0  # decides the delayed actor steps; checkpointed

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic steps; after every `policy_delay`-th critic step
        (counted over the whole run), an actor and temperature step on the same batch."""
        info, self.critic_updates = delayed_actor_steps(
            batch, self.critic_updates, self.agent.cfg.policy_delay, self.critic_update, self.actor_update
        )
        info[m.ACTOR_LR] = self.agent.schedule.current_lr()
        self.agent.schedule.advance()
        return info

    def critic_update(self, b: Batch) -> dict[str, Tensor]:
        p, rows = self.agent, len(b.obs)
        obs, next_obs = p.policy.obs_norm(b.obs), p.policy.obs_norm(b.next_obs)
        alpha = p.log_alpha.detach().exp()
        with torch.no_grad(), evaluating(p.policy):
            next_action, next_log_prob = p.policy(b.next_obs, p.generator)
        with autocast(obs.device, p.cfg.precision):
            # one forward of [(s, a); (s', a')]: batch renormalization sees both in one batch
            q_both = p.critic_ddp(torch.cat([obs, next_obs]), torch.cat([b.action, next_action]))  # (2, 2B)
        q, next_q = q_both[:, :rows], q_both[:, rows:].detach()
        target = soft_td_target(p.reward_norm(b.reward), bootstrap_factor(b.discount, b.terminated), next_q,
                                next_log_prob, alpha)
        q_loss = td_loss(q, target, p.cfg.critic_loss, p.cfg.huber_delta)
        grad_norm = p.critic_step(q_loss)
        self.largest_value = q.detach().abs().max()
        info = critic_diagnostics(q, q_loss, target, grad_norm, p.reward_norm.scale())
        return info | rlpd_diagnostics(q, p.cfg.prior_data, p.cfg.prior_data_ratio)

    def actor_update(self, b: Batch) -> dict[str, Tensor]:
        """SAC's actor and temperature step, the critics judging with their running statistics."""
        with evaluating(self.agent.critic):
            return sac_family.update_actor_and_temperature(self.agent, b.obs)

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critic_updates = int(state["critic_updates"])
