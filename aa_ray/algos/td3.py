"""TD3: Twin Delayed Deep Deterministic policy gradient.

Reference: Fujimoto, van Hoof and Meger 2018, "Addressing Function Approximation Error in
Actor-Critic Methods" (arXiv 1802.09477), Algorithm 1 and its defaults: Adam 1e-3 for actor and
critics, tau 0.005, target noise 0.2 clipped at 0.5, policy delay 2, exploration noise 0.1; widths
256x256 and batch 256 as in the authors' current `TD3.py` (which also lowered the rates to 3e-4;
1e-3 solves pusher-reach in fewer steps here). The three ideas, each visible in `update`:
- clipped double-Q: the target bootstraps from the smaller of two target critics;
- target policy smoothing: the target action is the target actor's action plus clipped Gaussian
  noise, clipped back into the action box (`smoothed_target_action`);
- delayed updates: the actor and *all* targets move once every `policy_delay` critic steps.
Deliberate choices:
- the two critics are one batched ensemble (one matmul per layer for both), as in `sac.py`;
- critic steps are counted across fleet steps and learner iterations (and checkpointed), so the
  actor runs on every `policy_delay`-th critic step whatever `utd_ratio` and `train_every` are;
  the actor step uses that critic step's batch, as in the paper;
- the actor maximizes Q1 only, as in the paper (the critics' min is used only in the target);
- the target actor is a copy of the actor network alone: it reads observations through the
  online policy's normalizer, which the learner updates between iterations.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from aa_ray import ddp
from aa_ray import metric_names as m
from aa_ray.algos import sac_family
from aa_ray.algos.bookkeeping import Bookkeeping
from aa_ray.algos.config import LearningRates, MLPNetworks, OffPolicyKnobs, RLPDKnobs
from aa_ray.algos.contexts import autocast, frozen
from aa_ray.algos.contract import TrainingSetup
from aa_ray.algos.gradient_step import polyak_update_
from aa_ray.algos.losses import (
    bootstrap_factor,
    critic_diagnostics,
    rlpd_diagnostics,
    smoothed_target_action,
    td_loss,
)
from aa_ray.algos.normalizers import RewardNormalizer
from aa_ray.algos.schedules import delayed_actor_steps
from aa_ray.nets.deterministic import DeterministicPolicy
from aa_ray.nets.mlp import EnsembleQ, mlp
from aa_ray.records import Batch, ObsDims


class TD3Config(OffPolicyKnobs, LearningRates, RLPDKnobs, MLPNetworks):
    name: Literal["td3"] = "td3"
    actor_lr: PositiveFloat = Field(1e-3, description="actor learning rate")
    policy_delay: PositiveInt = Field(2, description="critic steps per actor and target update")
    target_noise: NonNegativeFloat = Field(0.2, description="std of the Gaussian noise on the target action")
    target_noise_clip: NonNegativeFloat = Field(0.5, description="target noise is clipped to +-this")
    exploration_noise: NonNegativeFloat = Field(0.1, description="std of the Gaussian noise added when acting")


def make_policy(cfg: TD3Config, obs: ObsDims, act_dim: int) -> DeterministicPolicy:
    actor = mlp(obs.actor, cfg.actor_hidden_dims, act_dim)  # pre-tanh action
    return DeterministicPolicy(actor, obs, cfg.normalize_obs, cfg.exploration_noise)


class TD3(Bookkeeping):
    def __init__(self, cfg: TD3Config, obs: ObsDims, act_dim: int, setup: TrainingSetup):
        # the slow actor is a copy of the actor network alone: it reads the online policy's normalizer
        self.agent = sac_family.build_parts(
            cfg, act_dim, setup, policy=make_policy(cfg, obs, act_dim),
            critic=EnsembleQ(obs.full, act_dim, cfg.critic_hidden_dims, 2, layer_norm=cfg.layer_norm),
            reward_norm=RewardNormalizer(cfg.normalize_reward), slow_actor=True, temperature_learned=False,
        )
        self.policy, self.reward_norm, self.largest_value = self.agent.policy, self.agent.reward_norm, torch.zeros(())
        self.critic_updates = 0  # decides the delayed actor/target updates; checkpointed

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One fleet step: `batch.num_batches` critic steps; after every `policy_delay`-th critic step
        (counted over the whole run), an actor step on the same batch and a polyak step of the
        target actor and critics."""
        info, self.critic_updates = delayed_actor_steps(
            batch, self.critic_updates, self.agent.cfg.policy_delay, self.critic_update, self.actor_and_target_update
        )
        info[m.ACTOR_LR] = self.agent.schedule.current_lr()
        self.agent.schedule.advance()
        return info

    def critic_update(self, b: Batch) -> dict[str, Tensor]:
        p, cfg = self.agent, self.agent.cfg
        obs, next_obs = p.policy.obs_norm(b.obs), p.policy.obs_norm(b.next_obs)
        reward, bootstrap = p.reward_norm(b.reward), bootstrap_factor(b.discount, b.terminated)
        with autocast(obs.device, cfg.precision):
            # target from the slow actor with smoothing noise and the slow critics' min (clipped double-Q)
            with torch.no_grad():
                next_action = torch.tanh(p.actor_target(next_obs[..., : p.policy.actor_features])).float()
                noise = ddp.randn_shard(next_action.shape, p.generator, next_action.dtype) * cfg.target_noise
                next_action = smoothed_target_action(next_action, noise, cfg.target_noise_clip)
                target = reward + bootstrap * p.critic_target(next_obs, next_action).min(dim=0).values.float()
            q = p.critic_ddp(obs, b.action)  # (2, batch)
        q_loss = td_loss(q, target, cfg.critic_loss, cfg.huber_delta)
        grad_norm = p.critic_step(q_loss)
        self.largest_value = q.detach().abs().max()
        return critic_diagnostics(q, q_loss, target, grad_norm, p.reward_norm.scale()) | {
            # how often the smoothing noise hits its clip, and how often the target action hits the box
            "critic/target_noise_clip_fraction": (noise.abs() > cfg.target_noise_clip).float().mean(),
            "critic/target_action_bound_fraction": (next_action.abs() >= 1.0).float().mean(),
        } | rlpd_diagnostics(q, cfg.prior_data, cfg.prior_data_ratio)

    def actor_and_target_update(self, b: Batch) -> dict[str, Tensor]:
        p = self.agent
        info = self.actor_update(b)
        polyak_update_(p.policy.actor, p.actor_target, p.cfg.tau)
        polyak_update_(p.critic, p.critic_target, p.cfg.tau)
        return info

    def actor_update(self, b: Batch) -> dict[str, Tensor]:
        """The deterministic policy gradient through Q1 alone, as in the paper."""
        p = self.agent
        with autocast(b.obs.device, p.cfg.precision):
            action = p.policy_ddp(b.obs)
            with frozen(p.critic):
                q1 = p.critic(p.policy.obs_norm(b.obs), action)[0]
        actor_loss = -q1.float().mean()
        grad_norm = p.actor_step(actor_loss)
        return {
            m.ACTOR_LOSS: actor_loss.detach(),
            "actor/grad_norm": grad_norm,
            "actor/action_saturation": (action.detach().abs() > 0.99).float().mean(),
            "actor/updates": torch.tensor(float(self.critic_updates // p.cfg.policy_delay)),
        }

    def parts(self) -> dict[str, Any]:
        return self.agent.checkpoint_parts()

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critic_updates = int(state["critic_updates"])
