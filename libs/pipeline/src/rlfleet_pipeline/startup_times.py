"""When each service of a local fleet reached its start-up milestones (fleet.py reports
them in <run_dir>/startup.json)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StartupTimes:
    """Seconds from the fleet's start to each milestone of one service (None: not reached)."""

    spawned_s: float | None = None
    bound_s: float | None = None
    """Both ports bound and reported (the port file is written)."""
    serving_s: float | None = None
    """Health answered SERVING: the service's heavy start-up (model load...) is done."""

    def row(self) -> dict[str, float | None]:
        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 3)

        return {
            "spawned_s": None if self.spawned_s is None else round(self.spawned_s, 3),
            "bound_s": None if self.bound_s is None else round(self.bound_s, 3),
            "serving_s": None if self.serving_s is None else round(self.serving_s, 3),
            "bind_s": span(self.spawned_s, self.bound_s),
            "load_s": span(self.bound_s, self.serving_s),
        }
