"""The shared math of the off-policy family, written once, as pure functions of tensors.

Each variant's `update` calls these in the order of its paper. Nothing here reads a tensor on the
host: diagnostics come back as tensors and the learner reads them once.

Shapes: `B` rows in a batch, `C` critics in an ensemble, `N` atoms of a categorical support.
`bootstrap` is discount * (1 - terminated): only a true terminal masks it (a time limit bootstraps).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aa_ray import metric_names as m
from aa_ray.nets.distributional import project_distribution, saturation
from aa_ray.records import prior_rows


def bootstrap_factor(discount: Tensor, terminated: Tensor) -> Tensor:
    """gamma^k (1 - terminated), (B,): the weight of the next state's value in a k-step target."""
    return discount * (1.0 - terminated)


# --- critics ------------------------------------------------------------------------------------


def soft_td_target(
    reward: Tensor,  # (B,)
    bootstrap: Tensor,  # (B,)
    next_q: Tensor,  # (C, B) target critics at (s', a' ~ pi(.|s'))
    next_log_prob: Tensor,  # (B,) log pi(a'|s')
    alpha: Tensor,
) -> Tensor:
    """Soft Bellman target with clipped double-Q: r + bootstrap * (min_i Q'_i(s', a') - alpha log pi(a'|s'))."""
    return reward + bootstrap * (next_q.min(dim=0).values - alpha * next_log_prob).float()


def bee_target(soft_target: Tensor, reward: Tensor, bootstrap: Tensor, next_v: Tensor, bee_lambda: float) -> Tensor:
    """BEE: lambda * (r + bootstrap * V(s')) + (1 - lambda) * soft target. V is an upper expectile of
    the replayed actions' values, so the exploitation part bootstraps from the best actions seen."""
    exploit_target = reward + bootstrap * next_v.float()
    return bee_lambda * exploit_target + (1.0 - bee_lambda) * soft_target


def soft_value_target(replay_q: Tensor, log_prob: Tensor, alpha: Tensor) -> Tensor:
    """BAC's V target: min_i Q'_i(s, a_replay) - alpha log pi(a~|s), (C, B), (B,) -> (B,)."""
    return (replay_q.min(dim=0).values - alpha * log_prob).float()


def expectile_loss(prediction: Tensor, target: Tensor, expectile: float) -> Tensor:
    """Asymmetric squared error: under-predictions weigh `expectile`, over-predictions 1 - expectile,
    so the minimiser is the `expectile`-expectile of the target (0.5: the mean)."""
    err = target.float() - prediction.float()
    weight = torch.where(err >= 0, expectile, 1.0 - expectile)
    return (weight * err.pow(2)).mean()


def td_loss(prediction: Tensor, target: Tensor, kind: str, huber_delta: float) -> Tensor:
    """Per-critic mean TD loss in fp32, summed over the ensemble dim (dim 0)."""
    prediction, target = prediction.float(), target.float().expand_as(prediction)
    if kind == "huber":
        per_element = nn.functional.huber_loss(prediction, target, reduction="none", delta=huber_delta)
    else:
        per_element = (prediction - target).pow(2)
    return per_element.mean(dim=-1).sum()


def pessimistic_distribution(next_logits: Tensor, support: Tensor) -> Tensor:
    """Clipped double-Q on distributions, (C, B, N) logits -> (B, N) probabilities: per sample, the
    target critic whose distribution has the lower mean (a min over atoms would not be a distribution)."""
    probs = torch.softmax(next_logits.float(), dim=-1)
    pessimist = (probs * support).sum(-1).argmin(dim=0)  # (B,)
    return probs[pessimist, torch.arange(pessimist.shape[0], device=probs.device)]


def categorical_soft_target(
    next_logits: Tensor,  # (C, B, N) target critics at (s', a' ~ pi(.|s'))
    reward: Tensor,  # (B,)
    bootstrap: Tensor,  # (B,)
    next_log_prob: Tensor,  # (B,)
    alpha: Tensor,
    support: Tensor,  # (N,)
) -> tuple[Tensor, Tensor, Tensor]:
    """C51's soft target: the pessimistic target distribution of r + bootstrap * (Z' - alpha log pi),
    projected onto the support. The soft term is folded into the reward, r' = r - bootstrap alpha
    log pi, so the atoms are r' + bootstrap z_j. Returns the target (B, N) and, for its saturation
    diagnostics, the chosen next distribution (B, N) and r' (B,)."""
    next_probs = pessimistic_distribution(next_logits, support)
    soft_reward = reward - bootstrap * alpha * next_log_prob.float()
    return project_distribution(next_probs, soft_reward, bootstrap, support), next_probs, soft_reward


def categorical_cross_entropy(logits: Tensor, target_probs: Tensor) -> Tensor:
    """-sum_j p_j log q_j, averaged over the batch and summed over the critics, (C, B, N), (B, N)."""
    return -(target_probs * torch.log_softmax(logits.float(), dim=-1)).sum(-1).mean(-1).sum()


# --- actor and temperature ----------------------------------------------------------------------


def sac_actor_loss(log_prob: Tensor, q: Tensor, alpha: Tensor) -> Tensor:
    """E[alpha log pi(a|s) - min_i Q_i(s, a)], a ~ pi reparameterised; q (C, B)."""
    return (alpha * log_prob.float() - q.float().min(dim=0).values).mean()


def temperature_loss(log_alpha: Tensor, log_prob: Tensor, target_entropy: float) -> Tensor:
    """-E[alpha (log pi + H_target)]: raises alpha when the entropy is below the target, lowers it above."""
    return -(log_alpha.exp() * (log_prob.detach().float() + target_entropy)).mean()


def smoothed_target_action(next_action: Tensor, noise: Tensor, noise_clip: float) -> Tensor:
    """TD3's target policy smoothing: a' = clip(mu'(s') + clip(noise, -c, c), -1, 1), noise already scaled."""
    return (next_action + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


# --- diagnostics --------------------------------------------------------------------------------


def critic_diagnostics(
    q: Tensor, q_loss: Tensor, td_target: Tensor, grad_norm: Tensor, reward_scale: Tensor
) -> dict[str, Tensor]:
    """q (C, B) the online critics' values; q_loss summed over the C critics (reported per critic)."""
    q = q.detach().float()
    return {
        m.CRITIC_Q_LOSS: q_loss.detach() / q.shape[0],
        m.CRITIC_Q_VALUE: q.mean(),
        m.CRITIC_Q_MAX: q.max(),
        "critic/td_target": td_target.detach().float().mean(),
        "critic/grad_norm": grad_norm,
        "critic/reward_scale": reward_scale,
    }


def rlpd_diagnostics(q: Tensor, prior_data: str | None, prior_data_ratio: float) -> dict[str, Tensor]:
    """RLPD: mean Q on the prior rows (the first round(ratio * B)) vs the online rows; q (..., B)."""
    if prior_data is None:
        return {}
    q = q.detach().float()
    n = prior_rows(q.shape[-1], prior_data_ratio)
    prior, online = q[..., :n].mean(), q[..., n:].mean()
    return {m.CRITIC_PRIOR_Q: prior, m.CRITIC_ONLINE_Q: online, m.CRITIC_PRIOR_ONLINE_Q_GAP: prior - online}


def support_saturation(next_probs: Tensor, reward: Tensor, bootstrap: Tensor, support: Tensor) -> dict[str, Tensor]:
    """How much of the categorical target the support clipped, below v_min and above v_max."""
    low, high = saturation(next_probs, reward, bootstrap, support)
    return {"critic/support_saturation_low": low, "critic/support_saturation_high": high}


def sac_actor_diagnostics(
    actor_loss: Tensor, alpha: Tensor, alpha_loss: Tensor, log_prob: Tensor, grad_norm: Tensor
) -> dict[str, Tensor]:
    return {
        m.ACTOR_LOSS: actor_loss.detach(),
        m.ACTOR_ALPHA: alpha.detach(),
        "actor/alpha_loss": alpha_loss.detach(),
        m.ACTOR_ENTROPY: -log_prob.detach().float().mean(),
        "actor/grad_norm": grad_norm,
    }

