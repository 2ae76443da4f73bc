"""The bubblewrap command line of a sandbox, as a pure function of the host layout.

Every sandbox gets fresh user, PID, IPC, UTS, cgroup, mount and network namespaces (the
network namespace has only a loopback of its own: no route to the host or anywhere), all
capabilities dropped (the runner drops the last two itself once it has mounted its
inode-bounded tmpfs), no further user namespaces (so a program cannot mount an unbounded
tmpfs of its own), read-only system directories, size-capped private tmpfs for /tmp (the
work dir lives there) and /dev/shm, a read-only root, /proc of its own PID namespace, and
an environment that holds only what the config lists. bwrap itself is started under an
unprivileged host uid when the service is root (see `spawn_identity`), so the single uid
mapped into the sandbox is never host root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlfleet_core.bwrap import PROCESS_FLAGS, SANDBOX_UID, namespace_flags

logger = logging.getLogger(__name__)

"""uid and gid seen inside the sandbox (`nobody`)."""
SANDBOX_HOSTNAME = "sandbox"


@dataclass(frozen=True)
class HostPath:
    """A host path to expose read-only: a directory/file, or a symlink to recreate."""

    path: str
    symlink_target: str | None = None


def probe_host_paths(paths: Sequence[str]) -> list[HostPath]:
    """What each path is on this host; missing paths are dropped (e.g. no /lib64)."""
    found = []
    for path in paths:
        if os.path.islink(path):
            found.append(HostPath(path, os.readlink(path)))
        elif os.path.exists(path):
            found.append(HostPath(path))
    return found


def build_bwrap_command(
    *,
    prefix: Sequence[str],
    bwrap: str,
    host_paths: Sequence[HostPath],
    tmpfs_bytes: int,
    env: Mapping[str, str],
    argv: Sequence[str],
) -> list[str]:
    """The full bwrap argv that runs `argv` isolated. Pure: same inputs, same list."""
    cmd = [
        *prefix,
        bwrap,
        *namespace_flags(SANDBOX_UID),
        "--hostname",
        SANDBOX_HOSTNAME,
        *PROCESS_FLAGS,
        # Kept only until the runner has mounted /tmp and /dev/shm with an inode limit
        # (bwrap's --size sets no nr_inodes) and dropped every capability (runner.harden).
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--cap-add",
        "CAP_SETPCAP",
    ]
    for host in host_paths:
        if host.symlink_target is not None:
            cmd += ["--symlink", host.symlink_target, host.path]
        else:
            cmd += ["--ro-bind", host.path, host.path]
    cmd += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmpfs_bytes),
        "--tmpfs",
        "/tmp",
        "--size",
        str(tmpfs_bytes),
        "--tmpfs",
        "/dev/shm",
        # The root and /dev are bwrap's own tmpfs mounts with no size cap: read-only.
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
    ]
    for key, value in sorted(env.items()):
        cmd += ["--setenv", key, value]
    cmd += ["--", *argv]
    return cmd


def resolve_bwrap(bwrap: str) -> str:
    """Absolute path of the bwrap executable, or a FileNotFoundError saying how to get it."""
    found = shutil.which(bwrap)
    if found is None:
        raise FileNotFoundError(
            f"isolation.bwrap: {bwrap!r} not found; install bubblewrap "
            "(apt-get install -y bubblewrap) or set isolation.bwrap to its path"
        )
    return found


def privilege_drop_prefix(sandbox_uid: int, sandbox_gid: int, euid: int) -> list[str]:
    """As root, exec bwrap through `setpriv` under the configured unprivileged uid: a user
    namespace maps its uid to the uid of the process that created it, and that must not
    be host root. (setpriv rather than Popen(user=...): the latter forces a full fork()
    of the multi-threaded service, whose child crashed here while gRPC calls were in
    flight; a plain exec lets Python use vfork.)"""
    if euid != 0:
        return []
    return [
        "setpriv",
        f"--reuid={sandbox_uid}",
        f"--regid={sandbox_gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ]


CGROUP_SANDBOXES = "rlfleet-sandboxes"
"""The cgroup (below the service's own) that holds one child cgroup per sandbox."""
CGROUP_SERVICE_LEAF = "rlfleet-service"
"""Where the service's own processes move, so that its cgroup may delegate controllers
(cgroup v2 lets only a cgroup without processes of its own enable them for children)."""
CGROUP_CONTROLLERS = ("memory", "pids")


def cgroup_v2_mount(mounts_text: str) -> str | None:
    """Where the unified (v2) cgroup hierarchy is mounted, from /proc/self/mounts."""
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return None


def own_cgroup_v2_path(cgroup_text: str) -> str | None:
    """This process's cgroup v2 path ("0::/path" in /proc/self/cgroup)."""
    for line in cgroup_text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def setup_cgroup_v2(mount: str, own_path: str) -> str:
    """Prepare `<own cgroup>/rlfleet-sandboxes` with the memory and pids controllers
    enabled for its children, moving the processes of the service's own cgroup into a leaf
    first (the "no internal processes" rule). Returns its directory; OSError when the
    hierarchy is not ours to delegate (read-only, controllers bound elsewhere, ...)."""
    own = os.path.join(mount, own_path.lstrip("/"))
    with open(os.path.join(own, "cgroup.controllers")) as fh:
        available = fh.read().split()
    missing = [c for c in CGROUP_CONTROLLERS if c not in available]
    if missing:
        raise OSError(f"cgroup {own}: controllers {missing} not available (only {available})")
    enable = " ".join(f"+{c}" for c in CGROUP_CONTROLLERS)
    with open(os.path.join(own, "cgroup.subtree_control")) as fh:
        enabled = fh.read().split()
    if not all(c in enabled for c in CGROUP_CONTROLLERS):
        leaf = os.path.join(own, CGROUP_SERVICE_LEAF)
        os.makedirs(leaf, exist_ok=True)
        with open(os.path.join(own, "cgroup.procs")) as fh:
            procs = fh.read().split()
        for pid in procs:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                _write(os.path.join(leaf, "cgroup.procs"), pid)
        _write(os.path.join(own, "cgroup.subtree_control"), enable)
    sandboxes = os.path.join(own, CGROUP_SANDBOXES)
    os.makedirs(sandboxes, exist_ok=True)
    _write(os.path.join(sandboxes, "cgroup.subtree_control"), enable)
    return sandboxes


def find_cgroup_v2_root(mode: str) -> str | None:
    """The cgroup under which each sandbox gets its own (`isolation.cgroup`): None when
    off, or when the machine has no writable cgroup v2 hierarchy (then the runner's own
    accounting over the sandbox's process tree bounds runs alone)."""
    if mode == "off":
        return None
    try:
        with open("/proc/self/mounts") as fh:
            mount = cgroup_v2_mount(fh.read())
        with open("/proc/self/cgroup") as fh:
            own_path = own_cgroup_v2_path(fh.read())
        if mount is None or own_path is None:
            raise OSError("no cgroup v2 hierarchy mounted (cgroup v1 only?)")
        return setup_cgroup_v2(mount, own_path)
    except OSError as exc:
        logger.warning(
            "isolation.cgroup=auto: no cgroup per sandbox (%s); runs are bounded by the "
            "runner's accounting over each sandbox's processes",
            exc,
        )
        return None


class SandboxCgroup:
    """The cgroup v2 of one sandbox: the kernel bounds the memory (memory.max; tmpfs, memfd,
    pipe and socket buffers and kernel memory included) and the tasks (pids.max) of all its
    processes together; OOM kills and CPU (cpu.stat) are read around each run."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.baseline_bytes = 0
        """memory.current once the runner was ready: the runner's own, not the program's."""

    @classmethod
    def create(cls, root: str, name: str, pids: Sequence[int]) -> SandboxCgroup:
        cgroup = cls(os.path.join(root, name))
        os.makedirs(cgroup.path)
        for pid in pids:
            _write(os.path.join(cgroup.path, "cgroup.procs"), str(pid))
        cgroup.baseline_bytes = int(cgroup.read("memory.current") or 0)
        return cgroup

    def read(self, name: str) -> str:
        try:
            with open(os.path.join(self.path, name)) as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def limit(self, memory_bytes: int, max_processes: int) -> None:
        """Limits of the next run: the runner's baseline plus the run's memory, no swap
        (swapped-out pages would escape memory.max), the run's processes plus the runner
        and bwrap."""
        _write(os.path.join(self.path, "memory.max"), str(memory_bytes + self.baseline_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting on this kernel
            _write(os.path.join(self.path, "memory.swap.max"), "0")
        _write(os.path.join(self.path, "pids.max"), str(max_processes + 2))

    def oom_kills(self) -> int:
        for line in self.read("memory.events").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def cpu_s(self) -> float:
        for line in self.read("cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return 0.0

    def remove(self) -> None:
        """Remove the (empty) cgroup; its processes may take a moment to leave it."""
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
        logger.warning("cgroup %s could not be removed", self.path)


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)
