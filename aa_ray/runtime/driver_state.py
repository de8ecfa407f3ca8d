"""What the driver itself carries from one iteration to the next: its counters, its cadence (the
next evaluation and checkpoint) and its window of recent episodes and throughput. All of it goes
into every checkpoint, beside the actors' state, so a resumed run counts, evaluates and averages
exactly as the uninterrupted one would have.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aa_ray.records import NormMoments
from aa_ray.runtime.cadence import Cadence
from aa_ray.runtime.counters import RECENT_EPISODES, Counters, Window
from aa_ray.runtime.env_state import pack, unpack
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
    def from_checkpoint(
        cls, spec: ExperimentSpec, reports: bool, payload: dict[str, Any],
    ) -> tuple[DriverState, list[NormMoments]]:
        """The state a checkpoint saved, and the runners' normalizer moments the learners had not merged
        yet (which belong to the actor graph)."""
        saved = payload["counters"]
        state = cls(
            Counters(env_steps=saved["env_steps"], iterations=saved["iterations"], episodes=saved["episodes"]),
            Cadence(spec, reports, env_steps=saved["env_steps"], next_eval=saved["next_eval"]),
        )
        if "driver" not in payload:  # format 1: no pending moments, the averages start over
            return state, []
        driver = unpack(payload["driver"])
        state.window.returns.extend(driver["returns"])
        # (a checkpoint from before task metrics kept one of them under its own name: its train/* average
        # starts over)
        for key, values in driver.get("infos", {}).items():
            state.window.infos[key] = deque(values, maxlen=RECENT_EPISODES)
        return state, [NormMoments.from_dict(moments) for moments in driver["pending_stats"]]

    def checkpoint_fields(self, pending_stats: list[NormMoments]) -> dict[str, Any]:
        """The checkpoint's `counters` and `driver` entries (`pending_stats`: the actor graph's)."""
        c, w = self.counters, self.window
        return {
            "counters": {"env_steps": c.env_steps, "iterations": c.iterations, "episodes": c.episodes,
                         "next_eval": self.cadence.next_eval},
            # normalizer moments collected but not merged yet, and the episodes train/* averages over
            "driver": pack({
                "pending_stats": [moments.to_dict() for moments in pending_stats],
                "returns": list(w.returns), "infos": {key: list(values) for key, values in w.infos.items()},
            }),
        }
