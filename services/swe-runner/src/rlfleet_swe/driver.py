"""The program `Evaluate` runs inside the container (`python3 -c DRIVER`, request on stdin
as JSON): apply the patch and the test patch, check the applied tree, run the test command,
and print what the tests did.

Evidence rests on two things the code under test cannot reach:

- The driver process. It is the container's PID 1 (the kernel drops signals to it from its
  own namespace unless it has a handler, and it has none) and it makes itself non-dumpable
  (prctl PR_SET_DUMPABLE 0), so with every capability dropped a process of the same uid can
  neither ptrace it nor open /proc/1/{fd,mem,environ}. The call's nonce reaches it on stdin,
  which it reads before anything of the patch runs; the service counts only output lines
  that carry the nonce.
- The applied tree, checked by the driver with git before any patch code runs (see
  `_TREE_CHECK`): no file of the test patch, no protected name (conftest.py, pytest
  config, sitecustomize, *.pth, ...), no change to an existing test file or to an
  `__init__.py` of a test folder, no change to a file of a test folder (`tests/`,
  `test/`, `testing/`, `e2e/`, `test_*/`, `*_tests/`) and no new file there but a test
  module, no package metadata (`*.dist-info`, `*.egg-info`: their entry points load
  pytest plugins) or byte code, no symlink, and no new module or package whose top-level
  name is importable from outside the repository (stdlib, installed packages: `pytest.py`,
  `_pytest/`, `pluggy.py`, `json.py`, ...) at a place a test run puts on sys.path.

The report plugin (REPORT_PLUGIN, loaded by pytest under a random module name) sends each
test phase's outcome as it happens over a pipe to the driver, each line with a sequence
number and an HMAC whose key it read from a second pipe and closed at load; nothing stays in
a file or a module-level store. The driver reads the stream while the tests run, then kills
every other process of the container (kill(-1) from PID 1) and reads it to its end. A line
with a bad HMAC or out of sequence, a second outcome for one test phase, anything after the
end of the session, or a tamper report from the plugin (pytest's report machinery changed
under it) marks the run as tampered: every test MISSING, not resolved. A stream that ends
without the end of the session (pytest was killed or exited early) scores every test
MISSING too.

What remains: code running inside the pytest process can, in principle, walk that process's
memory (gc, frames, ctypes) to find the key and forge a complete, well-formed stream, or
change pytest in a way the plugin's checks do not cover. Those are deliberate attacks on
this plugin; the listed classes of simpler ones are refused or detected."""

from __future__ import annotations

from rlfleet_swe.report_plugin import REPORT_PLUGIN  # re-exported: evaluate.py sends it

DRIVER = r"""
import base64, ctypes, json, os, secrets, signal, stat, subprocess, sys, threading
import hmac as hmaclib

try:  # no ptrace of PID 1, no /proc/1/fd or /proc/1/mem for processes of our uid
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
req = json.loads(sys.stdin.read())
nonce = req["nonce"]
workdir = os.path.realpath(req["workdir"])
os.chdir(workdir)


def say(text):
    sys.stdout.write("\n@@rlfleet-swe " + nonce + " " + text + "\n")
    sys.stdout.flush()


def git(*args, data=None):
    return subprocess.run(["git", "-c", "core.quotepath=off", *args], input=data,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def numstat_paths(text):
    # The paths `git apply` itself will touch (both sides of a rename or copy).
    done = git("apply", "--numstat", "-z", "-", data=text.encode())
    tokens = done.stdout.split(b"\0")
    paths, i = [], 0
    while i < len(tokens) and tokens[i]:
        path = tokens[i].split(b"\t", 2)[-1]
        if path:
            paths.append(path)
            i += 1
        else:
            paths += tokens[i + 1 : i + 3]
            i += 3
    return {p.decode("utf-8", "surrogateescape") for p in paths if p}


def tree_status():
    done = git("status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored=matching",
               "--no-renames")
    return set(done.stdout.split(b"\0")) - {b""}


def refuse(why):
    say("refused " + base64.b64encode(why.encode()).decode())
    sys.exit(0)


def outside_names():
    # Top-level names importable from outside the repository in this interpreter.
    import pkgutil
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    roots = [p for p in sys.path if p and not (os.path.realpath(p) + "/").startswith(workdir + "/")
             and os.path.realpath(p) != workdir]
    names |= {m.name for m in pkgutil.iter_modules(roots)}
    return names | {"pytest", "_pytest", "pluggy", "py", "conftest"}


TEST_FILE = lambda base: (base.startswith("test_") or base.endswith("_test.py")) and base.endswith(".py")
MODULE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")
protected = req["protected"]
machinery = tuple(req["machinery"])  # results.IMPORT_MACHINERY


def is_protected(base):
    return base in protected or any(n.startswith("*") and base.endswith(n[1:]) for n in protected)


test_patch_paths = numstat_paths(req["test_patch"]) if req["test_patch"].strip() else set()
patch_paths = numstat_paths(req["patch"]) if req["patch"].strip() else set()
outside = outside_names()
before_status = tree_status()
tracked = set(git("ls-files", "-z").stdout.decode("utf-8", "surrogateescape").split("\0")) - {""}


def splits(path):
    # (root, top-level name) for every folder of `path` that could be a sys.path entry.
    parts = path.split("/")
    for i in range(len(parts)):
        name = parts[i]
        if i == len(parts) - 1:
            if not name.endswith(MODULE_SUFFIXES):
                continue
            name = name.split(".", 1)[0]
        yield "/".join(parts[:i]), name


def existed(root, name):
    base = os.path.join(root, name) if root else name
    return any(os.path.lexists(base + s) for s in ("", *MODULE_SUFFIXES)) or any(
        p == base or p.startswith(base + "/") or p.startswith(base + ".") for p in tracked)


existed_before = {(r, n): existed(r, n) for p in patch_paths for r, n in splits(p)}
test_files_before = {p for p in tracked if TEST_FILE(p.rsplit("/", 1)[-1])}
paths_before = {p for p in patch_paths if p in tracked or os.path.lexists(p)}
TEST_FOLDERS = ("test", "tests", "testing", "e2e")


def in_test_folder(path):
    # SWE-bench's split of a fix from its tests, by folder name: what the tests import
    # or read from there (helpers, fixtures, expected data) is theirs, not the patch's.
    return any(p in TEST_FOLDERS or p.startswith("test_") or p.endswith("_tests")
               for p in path.split("/")[:-1])

def apply(key):
    text = req[key]
    if not text.strip():
        return
    path = "/tmp/rlfleet-" + key + ".diff"
    with open(path, "w") as f:
        f.write(text)
    done = subprocess.run(["git", "apply", "--verbose", path], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    sys.stdout.write(done.stdout.decode(errors="replace"))
    if done.returncode != 0:
        say("apply-failed " + key)
        sys.exit(0)


def check_applied_tree():
    # What the patch changed, as git sees the applied tree (not the diff text).
    changed = set(patch_paths)
    for entry in tree_status() - before_status:
        changed.add(entry[3:].decode("utf-8", "surrogateescape").rstrip("/"))
    test_dirs = {p.rsplit("/", 1)[0] if "/" in p else "" for p in test_files_before | test_patch_paths}
    # pytest's default import mode puts the first folder above each test module that has
    # no __init__.py on sys.path; the repository root (the working directory) and src/ too.
    roots = {"", "src"}
    for folder in test_dirs:
        roots.add(folder)
        while folder and os.path.exists(os.path.join(folder, "__init__.py")):
            folder = folder.rsplit("/", 1)[0] if "/" in folder else ""
            roots.add(folder)
    problems = []
    for path in sorted(changed):
        base = path.rsplit("/", 1)[-1]
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        if path in test_patch_paths:
            problems.append(path + " (a file of the test patch)")
        elif is_protected(base):
            problems.append(path + " (can change how tests run or report: eval.protected_files)")
        elif any(part.endswith(machinery) for part in path.split("/")):
            problems.append(path + " (package metadata or byte code: entry points load pytest "
                            "plugins, a .pyc runs in place of its source)")
        elif os.path.islink(path):
            problems.append(path + " (a symlink)")
        elif path in test_files_before:
            problems.append(path + " (an existing test file)")
        elif base == "__init__.py" and folder in test_dirs:
            problems.append(path + " (the __init__.py of a test folder)")
        elif in_test_folder(path) and path in paths_before:
            problems.append(path + " (a file of a test folder: helpers and data the tests read)")
        elif in_test_folder(path) and not TEST_FILE(base):
            # e.g. tests/<package>/ with a fixed copy: the test folder comes first on
            # sys.path, so the tests would import it instead of the real package.
            problems.append(path + " (a new file in a test folder that is not a test module)")
        else:
            for root, name in splits(path):
                if root in roots and name in outside and not existed_before.get((root, name), False):
                    problems.append(path + " (shadows the importable module " + repr(name) + ")")
                    break
    if problems:
        refuse("the patch touches the test machinery: " + ", ".join(problems[:8]))


apply("patch")
check_applied_tree()
apply("test_patch")

key = secrets.token_bytes(32)
module = "rlfleet_report_" + secrets.token_hex(8)
folder = "/tmp/" + module
os.mkdir(folder, 0o700)
with open(os.path.join(folder, module + ".py"), "w") as f:
    f.write(req["plugin"])
os.chmod(folder, 0o500)
report_r, report_w = os.pipe()
key_r, key_w = os.pipe()
os.write(key_w, key)
os.close(key_w)
env = dict(os.environ, RLFLEET_SWE_REPORT_FD=str(report_w), RLFLEET_SWE_KEY_FD=str(key_r))
env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p " + module).strip()
stream = []


def read_stream():
    while True:
        chunk = os.read(report_r, 1 << 16)
        if not chunk:
            return
        stream.append(chunk)


reader = threading.Thread(target=read_stream, daemon=True)
reader.start()
say("tests-start")
proc = subprocess.Popen(req["test_command"], shell=True, stdin=subprocess.DEVNULL, env=env,
                        pass_fds=(report_w, key_r), start_new_session=True)
os.close(report_w)
os.close(key_r)
returncode = proc.wait()
# Whatever the tests left running (forked children, daemons) ends here, so nothing writes
# to the stream, or to our output, after this point.
if os.getpid() == 1:
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
else:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
reader.join(10)
outcomes, phases, problem = {}, set(), None
RANK = {"skipped": 0, "passed": 1, "failed": 2, "error": 3}
finished = False
if reader.is_alive():
    problem = "a process the tests started still holds the report channel"
lines = b"".join(stream).split(b"\n")
if lines and lines[-1] == b"":
    lines.pop()
elif lines:
    problem = problem or "the report stream ends in the middle of a line"
for seq, line in enumerate(lines):
    if problem:
        break
    body, _, mac = line.rpartition(b"\t")
    want = hmaclib.new(key, body, "sha256").hexdigest().encode()
    if not hmaclib.compare_digest(mac, want):
        problem = "report line %d is not the plugin's (bad HMAC)" % seq
        break
    fields = [f.decode("unicode_escape") for f in body.split(b"\t")]
    if fields[0] != str(seq):
        problem = "report line %d is out of sequence" % seq
    elif finished:
        problem = "a report line after the end of the test session"
    elif fields[1] == "tamper":
        problem = "the report plugin saw " + fields[2]
    elif fields[1] == "end":
        finished = True
    elif fields[1] == "r":
        nodeid, when, outcome = fields[2:5]
        if (nodeid, when) in phases:
            problem = "a second outcome for " + nodeid + " (" + when + ")"
        elif outcome not in RANK:
            problem = "an unknown outcome " + repr(outcome)
        else:
            phases.add((nodeid, when))
            seen = outcomes.get(nodeid)
            if seen is None or RANK[outcome] > RANK[seen]:  # teardown errors after a pass
                outcomes[nodeid] = outcome
result = {"outcomes": outcomes, "finished": finished, "tampered": problem,
          "plugin_loaded": bool(lines)}
say("report " + base64.b64encode(json.dumps(result).encode()).decode())
say("tests-exit %d" % returncode)
"""


__all__ = ["DRIVER", "MARKER", "REPORT_PLUGIN"]

MARKER = "@@rlfleet-swe "
