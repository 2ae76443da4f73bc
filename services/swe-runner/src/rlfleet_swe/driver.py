"""The program `Evaluate` runs inside the container (`python3 -c DRIVER`, request on stdin
as JSON): apply the patch, then the test patch, then run the test command.

Results come only from evidence the tested code cannot forge by printing: the driver loads
REPORT_PLUGIN into pytest (PYTEST_ADDOPTS, from a fresh folder on PYTHONPATH), which writes
each test's outcome to a file, and the driver prints that file inside a marker line that
carries the call's nonce. The nonce reaches the driver on stdin, which it has read before
the tests start, so code under test never sees it; lines without it are ignored. A test run
that ends without the plugin's report (the code under test killed pytest) scores every
test MISSING."""

from __future__ import annotations

DRIVER = r"""
import base64, json, os, subprocess, sys, tempfile
req = json.load(sys.stdin)
nonce = req["nonce"]
os.chdir(req["workdir"])
def say(text):
    sys.stdout.write("\n@@rlfleet-swe " + nonce + " " + text + "\n"); sys.stdout.flush()
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
folder = tempfile.mkdtemp(prefix="rlfleet-report-")
with open(os.path.join(folder, "rlfleet_swe_report.py"), "w") as f:
    f.write(req["plugin"])
report = os.path.join(folder, "report.json")
env = dict(os.environ, RLFLEET_SWE_REPORT=report)
env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p rlfleet_swe_report").strip()
say("tests-start")
done = subprocess.run(req["test_command"], shell=True, stdin=subprocess.DEVNULL, env=env)
try:
    with open(report, "rb") as f:
        data = f.read()
except OSError:
    data = b""
say("report " + base64.b64encode(data).decode())
say("tests-exit %d" % done.returncode)
"""

REPORT_PLUGIN = r"""
import json, os

_RANK = {"skipped": 0, "passed": 1, "failed": 2, "error": 3}
_outcomes = {}


def pytest_runtest_logreport(report):
    if report.when != "call" and report.outcome == "passed":
        return  # a passing setup/teardown says nothing on its own
    if hasattr(report, "wasxfail"):
        outcome = "passed"  # xfail and xpass count as passed, as in SWE-bench's harness
    elif report.outcome == "failed" and report.when != "call":
        outcome = "error"
    else:
        outcome = report.outcome
    seen = _outcomes.get(report.nodeid)
    if seen is None or _RANK[outcome] > _RANK[seen]:  # teardown errors after a pass
        _outcomes[report.nodeid] = outcome


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["RLFLEET_SWE_REPORT"], "w") as f:
        json.dump(_outcomes, f)
"""

MARKER = "@@rlfleet-swe "
