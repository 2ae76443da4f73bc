"""Process facts read from the kernel (Linux)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """`pid` is a running process: it exists (another user's counts) and is not a zombie
    (exited, waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The state follows the parenthesised command name, which may hold spaces.
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
