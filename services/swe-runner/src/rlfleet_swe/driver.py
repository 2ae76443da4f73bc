"""The program `Evaluate` runs inside the container (`python3 -c DRIVER`, request on stdin
as JSON): apply the patch, then the test patch, then run the test command. It prints
marker lines the service reads back; the test command's output goes between them."""

from __future__ import annotations

DRIVER = r"""
import json, os, subprocess, sys
req = json.load(sys.stdin)
os.chdir(req["workdir"])
def say(text):
    sys.stdout.write("\n@@rlfleet-swe " + text + "\n"); sys.stdout.flush()
for key in ("patch", "test_patch"):
    text = req[key]
    if not text.strip():
        continue
    path = "/tmp/rlfleet-" + key + ".diff"
    with open(path, "w") as f:
        f.write(text)
    done = subprocess.run(["git", "apply", "--verbose", path], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    sys.stdout.write(done.stdout.decode(errors="replace"))
    if done.returncode != 0:
        say("apply-failed " + key)
        sys.exit(0)
say("tests-start")
done = subprocess.run(req["test_command"], shell=True, stdin=subprocess.DEVNULL)
say("tests-exit %d" % done.returncode)
"""
MARKER = "@@rlfleet-swe "
