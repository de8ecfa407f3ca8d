"""What the driver itself carries from one iteration to the next: its counters, its cadence (the
next evaluation and checkpoint) and its window of recent episodes and throughput. All of it goes
into every checkpoint, beside the actors' state, so a resumed run counts, evaluates and averages
exactly as the uninterrupted one would have.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from aa_ray.records import DriverCheckpoint, NormMoments, RunCounters
from aa_ray.runtime.cadence import Cadence
from aa_ray.runtime.counters import RECENT_EPISODES, Counters, Window
from aa_ray.spec.experiment import ExperimentSpec


@dataclass
class DriverState:
    counters: Counters
    cadence: Cadence
    window: Window = field(default_factory=Window)

    @classmethod
    def fresh(cls, spec: ExperimentSpec, reports: bool) -> DriverState:
        """A run from its start (`reports`: a Tune trial's or the API's run, see `Cadence`)."""
        return cls(Counters(), Cadence(spec, reports=reports))

    @classmethod
    def from_checkpoint(cls, spec: ExperimentSpec, reports: bool, saved: DriverCheckpoint) -> DriverState:
        """The state a checkpoint saved (its pending normalizer moments belong to the actor graph)."""
        counters = saved.counters
        state = cls(
            Counters(env_steps=counters.env_steps, iterations=counters.iterations, episodes=counters.episodes),
            Cadence(spec, reports, env_steps=counters.env_steps, next_eval=counters.next_eval),
        )
        state.window.returns.extend(saved.returns)
        for key, values in saved.infos.items():
            state.window.infos[key] = deque(values, maxlen=RECENT_EPISODES)
        return state

    def checkpoint_part(self, pending_stats: list[NormMoments]) -> DriverCheckpoint:
        """The checkpoint's driver part (`pending_stats`: the actor graph's)."""
        c, w = self.counters, self.window
        return DriverCheckpoint(
            counters=RunCounters(env_steps=c.env_steps, iterations=c.iterations, episodes=c.episodes,
                                 next_eval=self.cadence.next_eval),
            pending_stats=list(pending_stats), returns=list(w.returns),
            infos={key: list(values) for key, values in w.infos.items()},
        )
