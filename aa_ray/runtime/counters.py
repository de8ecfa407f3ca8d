"""What the driver counts: the run's totals (`Counters`, in every checkpoint) and what it averages
between two metric logs (`Window`: throughput, recent episodes, policy lag)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from aa_ray import metric_names as m
from aa_ray.envs.info_metrics import metric_name

if TYPE_CHECKING:
    from aa_ray.runtime.loops import Iteration

WINDOW_S = 2.0  # throughput is averaged over at least this long
RECENT_EPISODES = 20  # train/* metrics average over this many finished episodes


@dataclass
class Counters:
    env_steps: int = 0
    iterations: int = 0
    episodes: int = 0
    evals: list[dict[str, float]] = field(default_factory=list)

    def count(self, it: Iteration) -> None:
        self.env_steps += it.env_steps
        self.episodes += len(it.episodes)
        self.iterations += 1


@dataclass
class Window:
    start: float = field(default_factory=time.perf_counter)
    env_steps: int = 0
    updates: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    infos: dict[str, deque] = field(default_factory=dict)  # info key -> its recent episodes' final values
    lags: list[int] = field(default_factory=list)

    def count(self, it: Iteration) -> None:
        self.env_steps += it.env_steps
        self.updates += it.updates
        self.lags += it.policy_lags
        for episode in it.episodes:
            self.returns.append(episode.episode_return)
            for key, value in episode.info.items():
                self.infos.setdefault(key, deque(maxlen=RECENT_EPISODES)).append(value)

    def metrics(self) -> dict[str, float]:
        """Throughput and policy lag since the last call that had them (then the window starts over),
        and the recent episodes' averages."""
        metrics = {}
        elapsed = time.perf_counter() - self.start
        if elapsed > WINDOW_S:
            metrics[m.ENV_STEPS_PER_S] = self.env_steps / elapsed
            metrics[m.LEARNER_UPDATES_PER_S] = self.updates / elapsed
            if self.lags:
                metrics[m.RUNTIME_POLICY_LAG_MEAN] = float(np.mean(self.lags))
                metrics[m.RUNTIME_POLICY_LAG_MAX] = float(max(self.lags))
            self.start, self.env_steps, self.updates, self.lags = time.perf_counter(), 0, 0, []
        if self.returns:
            metrics[m.TRAIN_EPISODE_RETURN] = float(np.mean(self.returns))
        for key, values in self.infos.items():  # train/success, train/<task metric>
            metrics[m.TRAIN_PREFIX + metric_name(key)] = float(np.mean(values))
        return metrics
