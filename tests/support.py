"""Helpers for the cross-service tests: real processes on loopback ports."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RLFLEET = str(Path(sys.executable).parent / "rlfleet")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
