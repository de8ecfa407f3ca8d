"""TD3: Twin Delayed Deep Deterministic policy gradient.

Reference: Fujimoto, van Hoof and Meger 2018, "Addressing Function Approximation Error in
Actor-Critic Methods" (arXiv 1802.09477), Algorithm 1 and its defaults: Adam 1e-3 for actor and
critics, tau 0.005, target noise 0.2 clipped at 0.5, policy delay 2, exploration noise 0.1; widths
256x256 and batch 256 as in the authors' current `TD3.py` (which also lowered the rates to 3e-4;
1e-3 solves pusher-reach in fewer steps here). The three ideas, each visible in `update_critic` / `update_actor`:
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

import copy
from typing import Literal

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from aa_ray import ddp
from aa_ray.algos.common import Batch, polyak_update_, tensors_to_cpu
from aa_ray.algos.knobs import GradientStep, OffPolicyConfig, RewardNormalizer, autocast, make_optimizer, td_loss
from aa_ray.nets.deterministic import DeterministicPolicy
from aa_ray.nets.mlp import EnsembleQ, mlp


class TD3Config(OffPolicyConfig):
    name: Literal["td3"] = "td3"
    actor_lr: PositiveFloat = Field(1e-3, description="actor learning rate")
    critic_lr: PositiveFloat = Field(1e-3, description="critic learning rate")
    hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="MLP widths (actor and critics)")
    policy_delay: PositiveInt = Field(2, description="critic steps per actor and target update")
    target_noise: NonNegativeFloat = Field(0.2, description="std of the Gaussian noise on the target action")
    target_noise_clip: NonNegativeFloat = Field(0.5, description="target noise is clipped to +-this")
    exploration_noise: NonNegativeFloat = Field(0.1, description="std of the Gaussian noise added when acting")


def make_policy(cfg: TD3Config, obs_dim: int, act_dim: int) -> DeterministicPolicy:
    actor = mlp(obs_dim, cfg.hidden_dims, act_dim)  # pre-tanh action
    return DeterministicPolicy(actor, obs_dim, cfg.normalize_obs, cfg.exploration_noise)


def smoothed_target_action(next_action: Tensor, noise: Tensor, noise_clip: float) -> Tensor:
    """Target policy smoothing: a' = clip(mu'(s') + clip(noise, -c, c), -1, 1), noise already scaled."""
    return (next_action + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


class TD3:
    def __init__(self, cfg: TD3Config, obs_dim: int, act_dim: int, device: torch.device, planned_steps: int = 0):
        self.cfg, self.device = cfg, device
        self.policy = make_policy(cfg, obs_dim, act_dim).to(device)
        self.actor_target = copy.deepcopy(self.policy.actor).requires_grad_(False)
        self.critic = EnsembleQ(obs_dim, act_dim, cfg.hidden_dims, num_critics=2).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.reward_norm = RewardNormalizer(cfg.normalize_reward).to(device)
        self.critic_updates = 0  # decides the delayed actor/target updates; checkpointed

        step = lambda optimizer: GradientStep(optimizer, cfg.max_grad_norm, cfg.precision, device)  # noqa: E731
        self.actor_step = step(make_optimizer(self.policy.actor, cfg.optimizer, cfg.actor_lr))
        self.critic_step = step(make_optimizer(self.critic, cfg.optimizer, cfg.critic_lr))

        # several learners: DDP averages the online modules' gradients; targets and normalizers stay plain
        self.policy_ddp, self.critic_ddp = ddp.wrap(self.policy), ddp.wrap(self.critic)

    def update(self, batch: Batch, diagnostics: bool = False) -> dict[str, float]:
        """One fleet step's worth of learning: `len(batch)` critic steps; after every
        `policy_delay`-th critic step (counted over the whole run), an actor step on the same
        batch and a polyak step of the target actor and critics."""
        delay = self.cfg.policy_delay
        actor_steps = [i for i in range(len(batch)) if (self.critic_updates + i + 1) % delay == 0]
        info: dict[str, float] = {}
        for i in range(len(batch)):
            b = batch.at(i)
            info |= self.update_critic(b, diagnostics and i == len(batch) - 1)
            self.critic_updates += 1
            if i in actor_steps:
                info |= self.update_actor(b, diagnostics and i == actor_steps[-1])
                polyak_update_(self.policy.actor, self.actor_target, self.cfg.tau)
                polyak_update_(self.critic, self.critic_target, self.cfg.tau)
        return info

    def update_critic(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        cfg = self.cfg
        obs, next_obs = self.policy.obs_norm(b.obs), self.policy.obs_norm(b.next_obs)
        reward = self.reward_norm(b.reward)
        with autocast(self.device, cfg.precision):
            # target from the slow actor with smoothing noise and the slow critics' min (clipped double-Q);
            # only a true terminal masks the bootstrap
            with torch.no_grad():
                next_action = torch.tanh(self.actor_target(next_obs)).float()
                noise = ddp.randn_shard(next_action.shape, next_action.device, next_action.dtype) * cfg.target_noise
                next_action = smoothed_target_action(next_action, noise, cfg.target_noise_clip)
                min_next_q = self.critic_target(next_obs, next_action).min(dim=0).values
                bootstrap = b.discount * (1.0 - b.terminated)
                next_q_value = reward + bootstrap * min_next_q.float()
            q = self.critic_ddp(obs, b.action)  # (2, batch)
        q_loss = td_loss(q, next_q_value, cfg.critic_loss, cfg.huber_delta)
        norm = self.critic_step(q_loss, measure=diagnostics)

        if not diagnostics:
            return {}
        return {
            "critic/q_loss": q_loss.item() / 2,
            "critic/q_value": q.float().mean().item(),
            "critic/q_max": q.float().max().item(),
            "critic/td_target": next_q_value.mean().item(),
            "critic/grad_norm": norm,
            "critic/reward_scale": self.reward_norm.scale(),
            # how often the smoothing noise hits its clip, and how often the target action hits the box
            "critic/target_noise_clip_fraction": (noise.abs() > cfg.target_noise_clip).float().mean().item(),
            "critic/target_action_bound_fraction": (next_action.abs() >= 1.0).float().mean().item(),
        }

    def update_actor(self, b: Batch, diagnostics: bool) -> dict[str, float]:
        with autocast(self.device, self.cfg.precision):
            action = self.policy_ddp(b.obs)
            # the critics only score the action here; skipping their weight gradients saves a third of backward
            self.critic.requires_grad_(False)
            q1 = self.critic(self.policy.obs_norm(b.obs), action)[0]
            self.critic.requires_grad_(True)
        actor_loss = -q1.float().mean()
        norm = self.actor_step(actor_loss, measure=diagnostics)

        if not diagnostics:
            return {}
        return {
            "actor/loss": actor_loss.item(),
            "actor/grad_norm": norm,
            "actor/action_saturation": (action.detach().abs() > 0.99).float().mean().item(),
            "actor/updates": float(self.critic_updates // self.cfg.policy_delay),
        }

    def policy_state(self) -> dict[str, torch.Tensor]:
        return tensors_to_cpu(self.policy.state_dict())

    def _parts(self) -> dict:
        return {
            "policy": self.policy, "actor_target": self.actor_target, "critic": self.critic,
            "critic_target": self.critic_target, "reward_norm": self.reward_norm,
            "actor_step": self.actor_step, "critic_step": self.critic_step,
        }

    def state_dict(self) -> dict:
        state = {name: part.state_dict() for name, part in self._parts().items()}
        return state | {"critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self._parts().items():
            part.load_state_dict(state[name])
        self.critic_updates = int(state["critic_updates"])
