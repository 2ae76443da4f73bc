"""The bubblewrap flags of the sandbox's isolation that the doctor's probe shares with it
(services/sandbox isolation.py builds the whole argv; `rlfleet doctor` starts bwrap with
these alone, so a machine that passes the probe allows exactly the namespaces a sandbox
asks for)."""

from __future__ import annotations

SANDBOX_UID = 65534
"""The uid and gid programs run as inside a sandbox (nobody)."""


def namespace_flags(uid: int = SANDBOX_UID) -> list[str]:
    """New user, pid, ipc, net, uts and cgroup namespaces, no nested user namespaces, and
    `uid` inside."""
    return [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup",
        "--disable-userns",
        "--assert-userns-disabled",
        "--uid",
        str(uid),
        "--gid",
        str(uid),
    ]


PROCESS_FLAGS = ("--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL")
"""The program is the namespace's init (bwrap's own init would be a dumpable process of the
sandbox's uid that a program could ptrace and that survives between runs; as init, the
runner also cannot be killed from inside), dies with its parent, has a session of its own
and no capabilities."""
