#!/usr/bin/env python3
"""A stand-in for `apptainer` (which cannot be installed here): it accepts exactly the
`apptainer exec` command line the swe-runner's apptainer backend generates, refuses any
other flag, and runs it with docker: the `.sif` file holds the docker image's name.

Each call's argv is appended, as JSON, to $FAKE_APPTAINER_LOG when that is set. On SIGTERM
(the backend's watchdog) it kills its container, as apptainer tears its container down.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys

VALUE_FLAGS = {"--network", "--memory", "--memory-swap", "--cpus", "--pids-limit", "--pwd"}
BOOL_FLAGS = {"--containall", "--writable-tmpfs", "--cleanenv", "--net"}
REQUIRED = {"--containall", "--writable-tmpfs", "--net", "--network", "--memory", "--cpus",
            "--pids-limit", "--pwd"}  # fmt: skip


def main(argv: list[str]) -> int:
    if log := os.environ.get("FAKE_APPTAINER_LOG"):
        with open(log, "a") as out:
            out.write(json.dumps(argv) + "\n")
    if not argv or argv[0] != "exec":
        print(f"fake apptainer: only `exec` is supported, got {argv[:1]}", file=sys.stderr)
        return 255
    options: dict[str, str] = {}
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in BOOL_FLAGS:
            options[flag] = ""
        elif flag in VALUE_FLAGS and rest:
            options[flag] = rest.pop(0)
        else:
            print(f"fake apptainer: unknown flag {flag}", file=sys.stderr)
            return 255
    if missing := REQUIRED - set(options):
        print(f"fake apptainer: missing {sorted(missing)}", file=sys.stderr)
        return 255
    if options["--network"] != "none" or len(rest) < 2:
        print("fake apptainer: needs --network none, an image and a command", file=sys.stderr)
        return 255
    sif, command = rest[0], rest[1:]
    try:
        with open(sif) as file:
            image = file.read().strip()
    except OSError as error:
        print(f"FATAL: could not open image {sif}: {error}", file=sys.stderr)
        return 255
    name = f"fake-apptainer-{secrets.token_hex(6)}"
    label = os.environ.get("FAKE_APPTAINER_LABEL", "fake-apptainer")
    docker = ["docker", "run", "--rm", "-i", "--pull", "never", "--name", name,
              "--label", f"rlfleet.swe.runner={label}", "--network", "none",
              "--memory", options["--memory"],
              "--memory-swap", options.get("--memory-swap", options["--memory"]),
              "--cpus", options["--cpus"], "--pids-limit", options["--pids-limit"],
              "--cap-drop", "ALL", "--workdir", options["--pwd"], image, *command]  # fmt: skip
    child = subprocess.Popen(docker)

    def stop(signum: int, frame: object) -> None:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=30)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
