"""What one doctor check reports (`Check`): the type every probe module (system.py,
builds.py, wheels.py) returns and the doctor's package gathers, so each imports it from
here one way."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    """What was found, one line."""
    fix: str = ""
    """The command (or the one step) that fixes a miss; empty when ok."""

    def line(self) -> str:
        text = f"{self.status:<4} {self.name}: {self.found}"
        return f"{text}; fix: {self.fix}" if self.fix else text

    def to_json(self) -> dict[str, str]:
        return asdict(self)
