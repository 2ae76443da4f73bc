#!/usr/bin/env python3
"""A stand-in for `apptainer` (which cannot be installed here): it accepts exactly the
command lines the swe-runner's apptainer backend generates (`exec`, and `instance start`,
`exec instance://NAME`, `instance stop` for agent sessions), refuses any other flag, and
runs them with docker: the `.sif` file holds the docker image's name.

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
    label = os.environ.get("FAKE_APPTAINER_LABEL", "fake-apptainer")
    if argv[:2] == ["instance", "stop"] and len(argv) == 3:
        return subprocess.run(["docker", "rm", "-f", f"fake-{argv[2]}"], check=False).returncode
    if argv[:2] == ["exec", "--pwd"] and len(argv) > 4 and argv[3].startswith("instance://"):
        name = "fake-" + argv[3].removeprefix("instance://")
        return subprocess.run(["docker", "exec", "-i", "--workdir", argv[2], name, *argv[4:]],
                              check=False).returncode  # fmt: skip
    instance = argv[:2] == ["instance", "start"]
    if not (instance or argv[:1] == ["exec"]):
        print(f"fake apptainer: unsupported command {argv[:2]}", file=sys.stderr)
        return 255
    options: dict[str, str] = {}
    rest = argv[2:] if instance else argv[1:]
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in BOOL_FLAGS:
            options[flag] = ""
        elif flag in VALUE_FLAGS and rest:
            options[flag] = rest.pop(0)
        else:
            print(f"fake apptainer: unknown flag {flag}", file=sys.stderr)
            return 255
    if missing := REQUIRED - set(options) - ({"--pwd"} if instance else set()):
        print(f"fake apptainer: missing {sorted(missing)}", file=sys.stderr)
        return 255
    if options["--network"] != "none" or len(rest) < 2:
        print("fake apptainer: needs --network none, an image and a command", file=sys.stderr)
        return 255
    sif, command = rest[0], rest[1:]
    if instance and len(command) != 1:
        print("fake apptainer: instance start IMAGE NAME", file=sys.stderr)
        return 255
    try:
        with open(sif) as file:
            image = file.read().strip()
    except OSError as error:
        print(f"FATAL: could not open image {sif}: {error}", file=sys.stderr)
        return 255
    name = f"fake-{command[0]}" if instance else f"fake-apptainer-{secrets.token_hex(6)}"
    docker = ["docker", "run", "--rm", "-i", "--pull", "never", "--name", name,
              "--label", f"rlfleet.swe.runner={label}", "--network", "none",
              "--memory", options["--memory"],
              "--memory-swap", options.get("--memory-swap", options["--memory"]),
              "--cpus", options["--cpus"], "--pids-limit", options["--pids-limit"],
              "--cap-drop", "ALL"]  # fmt: skip
    if instance:  # a running instance: later `exec instance://NAME` calls run in it
        docker[3] = "-d"
        return subprocess.run([*docker, "--entrypoint", "sleep", image, "infinity"],
                              check=False).returncode  # fmt: skip
    docker += ["--workdir", options["--pwd"], image, *command]
    child = subprocess.Popen(docker)

    def stop(signum: int, frame: object) -> None:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=30)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
