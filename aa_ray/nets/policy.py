"""What env runners act with: an observation normalizer in front of a squashed-Gaussian actor."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from aa_ray import ddp
from aa_ray.records import ObsDims

Array = TypeVar("Array", np.ndarray, Tensor)
PolicyState = Mapping[str, Tensor | np.ndarray]  # a policy's state dict, as tensors or as `state_arrays`


def state_arrays(state: Mapping[str, Tensor]) -> dict[str, np.ndarray]:
    """A policy's state dict (host tensors) as numpy arrays: the form learner 0 publishes weights in.
    Ray passes numpy arrays as raw buffers, where it pickles a tensor through `torch.save`: on a
    2-core CPU that cost 2-3 times the CPU of the put and 7-11 times that of every runner's read
    (`benchmarks/bench_scale_out.py --part weights`, RESULTS 43)."""
    return {name: value.numpy() for name, value in state.items()}


def state_tensors(state: PolicyState) -> dict[str, Tensor]:
    """A policy's state dict as tensors, whichever of the two forms it came in: numpy arrays are
    copied (Ray hands them out read-only, and torch keeps no tensor over read-only memory)."""
    return {name: value if isinstance(value, Tensor) else torch.from_numpy(np.array(value))
            for name, value in state.items()}


class ObsNormalizer(nn.Module):
    """Running mean/variance of observations, merged from per-chunk moments.

    The statistics change only through `merge` (called by the learner between updates), so
    they are frozen during an update and identical on every runner that loads the policy.
    """

    def __init__(self, obs_dim: int, enabled: bool, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.enabled = enabled
        self.clip = clip
        self.eps = eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))

    @torch.no_grad()
    def merge(self, count: float, mean: np.ndarray, var: np.ndarray) -> None:
        """Chan et al.'s parallel update of (count, mean, var) with a chunk's moments."""
        if not self.enabled or count <= 0:
            return
        mean_b = torch.as_tensor(mean, dtype=torch.float64, device=self.mean.device)
        var_b = torch.as_tensor(var, dtype=torch.float64, device=self.var.device)
        total = self.count + count
        delta = mean_b - self.mean
        m2 = self.var * self.count + var_b * count + delta.pow(2) * self.count * count / total
        self.mean += delta * count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, obs: Tensor) -> Tensor:
        """Normalized observations; fewer features than the statistics hold are their leading ones
        (an actor's input, `ObsDims.actor`)."""
        if not self.enabled:
            return obs
        features = obs.shape[-1]
        mean, var = self.mean[:features].to(obs.dtype), self.var[:features].to(obs.dtype)
        return ((obs - mean) / torch.sqrt(var + self.eps)).clamp(-self.clip, self.clip)


def acting_input(obs: np.ndarray | Tensor) -> Tensor:
    """Observations to act on as a float32 tensor: a tensor stays on its device, uncopied."""
    return torch.as_tensor(obs, dtype=torch.float32)


def as_given(out: Tensor, obs: np.ndarray | Tensor) -> np.ndarray | Tensor:
    """Acting's result in the form its observations came in: numpy for numpy (a vector env's runner),
    a tensor on the observations' device for a tensor (a batched env's, which never leaves its device)."""
    return out if isinstance(obs, Tensor) else out.numpy()


def to_bounds(unit: Array, low: Array, high: Array) -> Array:
    """Policy actions in [-1, 1] mapped onto an env's bounds (numpy or torch): what runners, the
    API and exported policies send the env (replay and datasets keep the [-1, 1] ones)."""
    return low + 0.5 * (unit + 1.0) * (high - low)


def from_bounds(action: Array, low: Array, high: Array) -> Array:
    """The inverse of `to_bounds`: env actions mapped back to the policy's [-1, 1] (not clipped)."""
    return 2.0 * (action - low) / (high - low) - 1.0


def actor_input(obs_norm: ObsNormalizer, obs: Tensor, features: int) -> Tensor:
    """What an actor reads of raw observations (..., full or actor features): the leading `features`,
    normalized."""
    return obs_norm(obs[..., :features])


def squashed_gaussian_sample(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """Reparameterised tanh-Gaussian sample for standard normal `noise`, and its log-probability,
    summed over action dims."""
    std = log_std.exp()
    pre_tanh = mean + std * noise
    action = torch.tanh(pre_tanh)
    gaussian_log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    # change of variables through tanh, in the numerically stable form
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))
    log_det = 2.0 * (math.log(2.0) - pre_tanh - nn.functional.softplus(-2.0 * pre_tanh))
    return action, (gaussian_log_prob - log_det).sum(-1)


class SquashedGaussianPolicy(nn.Module):
    """normalizer -> actor (mean, log_std) -> tanh; actions in [-1, 1]."""

    def __init__(self, actor: nn.Module, obs: ObsDims, normalize_obs: bool):
        super().__init__()
        self.obs_norm = ObsNormalizer(obs.full, enabled=normalize_obs)
        self.actor = actor
        self.actor_features = obs.actor  # a plain number: the weights a checkpoint holds do not change

    def forward(self, obs: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A sampled action and its log-prob, for training (obs are raw): the noise is this learner's
        rows of the global batch's, drawn from the learner's `generator`."""
        mean, log_std = self.actor(actor_input(self.obs_norm, obs, self.actor_features))
        return squashed_gaussian_sample(mean, log_std, ddp.randn_shard(mean.shape, generator, mean.dtype))

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The squashed mean in [-1, 1], for raw observations (evaluation, exported policies)."""
        return torch.tanh(self.actor(actor_input(self.obs_norm, obs, self.actor_features))[0])

    @torch.no_grad()
    def act(self, obs: Array, deterministic: bool, generator: torch.Generator | None = None) -> Array:
        """Actions in [-1, 1] for raw observations, numpy or a tensor (`as_given`)."""
        obs_t = acting_input(obs)
        if deterministic:
            return as_given(self.deterministic_action(obs_t), obs)
        mean, log_std = self.actor(actor_input(self.obs_norm, obs_t, self.actor_features))
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        # the action of `squashed_gaussian_sample`, op for op, without its log-prob: acting needs none,
        # and at one env per runner those element-wise ops were a third of a runner's CPU per step
        return as_given(torch.tanh(mean + log_std.exp() * noise), obs)


class BoundedPolicy(nn.Module):
    """A policy's deterministic action mapped onto the env's action bounds: raw observations in,
    env actions out, the observation normalizer included (what `aa-ray export` writes)."""

    def __init__(self, policy: nn.Module, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.policy = policy
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def forward(self, obs: Tensor) -> Tensor:
        return to_bounds(self.policy.deterministic_action(obs), self.low, self.high)
