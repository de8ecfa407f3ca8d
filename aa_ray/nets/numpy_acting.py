"""A plain ReLU-MLP policy's exploring action in numpy, for env runners that step a few env copies.

At one env per runner, acting through torch was the larger part of a runner's CPU per step: a
small MLP's forward pass is about 20 ops, and at one row each costs torch's fixed price of a
dispatch and a fresh tensor, several µs on a 2-core CPU, where numpy's costs about one. A runner
whose policy is one of the plain-MLP kinds below acts through a numpy copy of its weights, taken
each time it loads new ones: its CPU per step fell from about 270 µs to about 115 µs at one env and
from 24 µs to 13 µs per env at 16 (`benchmarks/bench_scale.py --part runner`, RESULTS 43).

The arithmetic is that of `SquashedGaussianPolicy.act` and `DeterministicPolicy.act`, in the same
order and in float32; the noise comes from the runner's torch generator, as before, so the draws
are the same. Only the matrix products round differently (another summation order), which
`tests/test_numpy_acting.py` bounds against the torch policies. Every other policy, a batched
runner's tensors, and evaluation act through torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from aa_ray.nets.deterministic import DeterministicPolicy
from aa_ray.nets.mlp import LOG_STD_MAX, LOG_STD_MIN, MLPActor
from aa_ray.nets.policy import ObsNormalizer, SquashedGaussianPolicy

NumpyActing = Callable[[np.ndarray, torch.Generator], np.ndarray]


@dataclass(frozen=True)
class NumpyMLP:
    """A ReLU MLP's layers as float32 arrays: (in, out) weights, so that `x @ w` needs no transpose."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, net: nn.Sequential) -> NumpyMLP | None:
        """The copy of `net`, or None where it is not Linear layers with ReLUs between them (`nets.mlp.mlp`)."""
        linears = [layer for layer in net if isinstance(layer, nn.Linear)]
        expected = [nn.Linear, nn.ReLU] * (len(linears) - 1) + [nn.Linear]
        if [type(layer) for layer in net] != expected:
            return None
        return cls(
            tuple(np.ascontiguousarray(layer.weight.detach().cpu().numpy().T) for layer in linears),
            tuple(layer.bias.detach().cpu().numpy().copy() for layer in linears),
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for weight, bias in zip(self.weights[:-1], self.biases[:-1], strict=True):
            x = x @ weight
            x += bias
            np.maximum(x, 0.0, out=x)
        return x @ self.weights[-1] + self.biases[-1]


@dataclass(frozen=True)
class NumpyNormalizer:
    """`ObsNormalizer.forward` in float32 for the leading `features`; None when normalization is off."""

    mean: np.ndarray
    std: np.ndarray
    clip: float

    @classmethod
    def of(cls, norm: ObsNormalizer, features: int) -> NumpyNormalizer | None:
        if not norm.enabled:
            return None
        mean, var = (stat[:features].cpu().numpy().astype(np.float32) for stat in (norm.mean, norm.var))
        return cls(mean, np.sqrt(var + np.float32(norm.eps)), norm.clip)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return np.clip((obs - self.mean) / self.std, -self.clip, self.clip)


def _actor_input(obs: np.ndarray, features: int, norm: NumpyNormalizer | None) -> np.ndarray:
    x = np.asarray(obs[:, :features], dtype=np.float32)
    return x if norm is None else norm(x)


class NoiseDraws:
    """Standard-normal float32 draws from a torch generator, written into one array that every call
    reuses: the numbers `torch.randn(shape, generator=...)` gives (it fills a new tensor with
    `normal_`), so the draws and the generator's state stay those of torch acting. At a runner's few
    rows, making the tensor and viewing it as numpy cost more than the draw itself (8 against 3 us a
    call on the 2-core AMD EPYC of RESULTS 44). A caller consumes the array before its next call."""

    def __init__(self) -> None:
        self.array = np.empty(0, np.float32)
        self.tensor = torch.from_numpy(self.array)

    def __call__(self, shape: tuple[int, ...], generator: torch.Generator) -> np.ndarray:
        if self.array.shape != shape:
            self.array = np.empty(shape, np.float32)
            self.tensor = torch.from_numpy(self.array)
        self.tensor.normal_(generator=generator)
        return self.array


def numpy_acting(policy: nn.Module) -> NumpyActing | None:
    """`policy.act(obs, deterministic=False, generator)` for numpy observations, in numpy, with the
    policy's current weights; None for a policy that is not a plain-MLP kind (it acts through torch)."""
    if type(policy) is SquashedGaussianPolicy and type(policy.actor) is MLPActor:
        return _squashed_gaussian(policy)
    if type(policy) is DeterministicPolicy and isinstance(policy.actor, nn.Sequential):
        return _deterministic(policy)
    return None


def _squashed_gaussian(policy: SquashedGaussianPolicy) -> NumpyActing | None:
    net = NumpyMLP.of(policy.actor.net)
    if net is None:
        return None
    features, norm = policy.actor_features, NumpyNormalizer.of(policy.obs_norm, policy.actor_features)
    act_dim = net.biases[-1].shape[0] // 2
    noise = NoiseDraws()

    def act(obs: np.ndarray, generator: torch.Generator) -> np.ndarray:
        out = net(_actor_input(obs, features, norm))
        mean, raw_log_std = out[:, :act_dim], out[:, act_dim:]
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (np.tanh(raw_log_std) + 1)  # bounded_log_std
        return np.tanh(mean + np.exp(log_std) * noise(mean.shape, generator))

    return act


def _deterministic(policy: DeterministicPolicy) -> NumpyActing | None:
    net = NumpyMLP.of(policy.actor)
    if net is None:
        return None
    features, norm = policy.actor_features, NumpyNormalizer.of(policy.obs_norm, policy.actor_features)
    scale, noise = np.float32(policy.exploration_noise), NoiseDraws()

    def act(obs: np.ndarray, generator: torch.Generator) -> np.ndarray:
        action = np.tanh(net(_actor_input(obs, features, norm)))
        if scale == 0:
            return action
        return np.clip(action + scale * noise(action.shape, generator), -1.0, 1.0)

    return act
