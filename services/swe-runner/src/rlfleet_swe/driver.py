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
  `__init__.py` of a test folder, no symlink, and no new module or package whose top-level
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
        elif os.path.islink(path):
            problems.append(path + " (a symlink)")
        elif path in test_files_before:
            problems.append(path + " (an existing test file)")
        elif base == "__init__.py" and folder in test_dirs:
            problems.append(path + " (the __init__.py of a test folder)")
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

REPORT_PLUGIN = r"""
import os as _os

# Everything the reporter needs is bound here, at load (before any test module is imported),
# so replacing a module attribute later (os.write, hmac, json) changes nothing it sends.
_write, _getpid, _close = _os.write, _os.getpid, _os.close
try:
    from _hashlib import hmac_digest as _digest
except ImportError:
    from hmac import digest as _digest
"x\t\n".encode("unicode_escape")  # the codec is cached from here on


def _code(module_name, *names):
    import importlib
    try:
        owner = importlib.import_module(module_name)
        for name in names:
            owner = getattr(owner, name)
        return owner.__code__
    except (ImportError, AttributeError):
        return None  # this pytest lacks it: that provenance check is skipped


_CALL_AND_REPORT = _code("_pytest.runner", "call_and_report")
_WRAP_SESSION = _code("_pytest.main", "wrap_session")
_PERFORM_COLLECT = _code("_pytest.main", "Session", "perform_collect")
import sys as _sys
_getframe = _sys._getframe


def _caller(code):
    # The frame of `code` among this call's callers, or None.
    frame = _getframe(2)
    for _ in range(64):
        if frame is None or frame.f_code is code:
            return frame
        frame = frame.f_back
    return None


def _channel():
    key_fd = int(_os.environ.pop("RLFLEET_SWE_KEY_FD", "-1"))
    out_fd = int(_os.environ.pop("RLFLEET_SWE_REPORT_FD", "-1"))
    if key_fd < 0 or out_fd < 0:
        return None
    key = b""
    while len(key) < 32:
        chunk = _os.read(key_fd, 32 - len(key))
        if not chunk:
            break
        key += chunk
    _close(key_fd)
    _os.set_inheritable(out_fd, False)  # subprocesses of the tests do not get it
    owner = _getpid()
    sequence = [0]
    collected = {}
    state = {"items": False, "ended": False}

    def send(*fields):
        body = b"\t".join([str(sequence[0]).encode()] + [str(f).encode("unicode_escape")
                                                        for f in fields])
        sequence[0] += 1
        data = body + b"\t" + _digest(key, body, "sha256").hex().encode() + b"\n"
        while data:
            data = data[_write(out_fd, data):]

    def emit(kind, *fields, report=None, session=None):
        # What a line claims is checked here, against the callers' frames, so calling the
        # reporter (found through sys.modules, gc or the plugin manager) forges nothing:
        # an outcome only from pytest's own call_and_report for a collected item, the end
        # only from pytest's own wrap_session.
        if _getpid() != owner:
            return  # a forked child of the tests speaks for nobody
        if kind == "items":
            frame = _caller(_PERFORM_COLLECT) if _PERFORM_COLLECT else True
            if state["items"] or frame is None:
                return send("tamper", "a second or foreign end of collection")
            state["items"] = True
            collected.update((id(item), item) for item in session.items)
            return None
        if kind == "r":
            if _CALL_AND_REPORT is not None:
                frame = _caller(_CALL_AND_REPORT)
                item = frame.f_locals.get("item") if frame is not None else None
                if (frame is None or frame.f_locals.get("report") is not report
                        or collected.get(id(item)) is not item or item.nodeid != report.nodeid
                        or "runtest" in vars(item)):
                    return send("tamper", "a report for " + repr(getattr(report, "nodeid", None))
                                + " that pytest's runner did not make for a collected test")
        elif kind == "end":
            if state["ended"] or (_WRAP_SESSION is not None and _caller(_WRAP_SESSION) is None):
                return send("tamper", "an end of session that pytest did not call")
            state["ended"] = True
        return send(kind, *fields)

    return emit


_emit = [_channel()]
_registered = [False]
from pytest import hookimpl as _pytest_hookimpl  # noqa: E402

# Hooks whose implementations decide or carry a test's outcome; one added during the run
# (by code under test) is tampering, except those of the repository's own conftest.py files.
_WATCHED_HOOKS = (
    "pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call",
    "pytest_runtest_teardown", "pytest_runtest_makereport", "pytest_pyfunc_call",
    "pytest_runtest_logreport", "pytest_report_teststatus", "pytest_runtestloop",
    "pytest_collection_modifyitems", "pytest_deselected", "pytest_sessionfinish",
)


def _watched_functions():
    # The functions and classes that turn a test run into reports (pytest 3-8, pluggy
    # 0.x-1.x: a name this version lacks is skipped).
    import importlib
    spots = [
        ("_pytest.runner", None, ("call_and_report", "runtestprotocol", "call_runtest_hook",
                                  "pytest_runtest_makereport", "pytest_runtest_call",
                                  "pytest_runtest_protocol", "check_interactive_exception")),
        ("_pytest.runner", "CallInfo", ("from_call", "__init__")),
        ("_pytest.reports", "TestReport", ("from_item_and_call", "__init__")),
        ("_pytest.reports", "BaseReport", ("passed", "failed", "skipped")),
        ("_pytest.python", "Function", ("runtest", "setup")),
        ("_pytest.python", None, ("pytest_pyfunc_call",)),
        ("_pytest.skipping", None, ("pytest_runtest_makereport", "pytest_runtest_call",
                                    "pytest_runtest_setup", "evaluate_xfail_marks")),
        ("_pytest.main", None, ("pytest_runtestloop",)),
        ("_pytest.unittest", "TestCaseFunction", ("runtest", "setup")),
        ("pluggy._callers", None, ("_multicall",)),
        ("pluggy.callers", None, ("_multicall",)),
        ("pluggy._hooks", "_HookCaller", ("__call__", "call_historic", "_hookexec")),
        ("pluggy._hooks", "HookCaller", ("__call__", "call_historic", "_hookexec")),
        ("pluggy.hooks", "_HookCaller", ("__call__", "call_historic", "_hookexec")),
        ("pluggy._manager", "PluginManager", ("_hookexec",)),
        ("pluggy.manager", "PluginManager", ("_hookexec",)),
    ]
    found = {}
    for module_name, class_name, names in spots:
        try:
            owner = importlib.import_module(module_name)
        except ImportError:
            continue
        if class_name is not None:
            owner = owner.__dict__.get(class_name)
            if owner is None:
                continue
        for name in names:
            found[(id(owner), name)] = (owner, name, owner.__dict__.get(name))
    return found


class _Reporter:
    def __init__(self, config):
        self.config = config
        self.baseline = None
        self.known = None
        self.rootdir = str(getattr(config, "rootpath", None) or config.rootdir) + "/"
        self.done = False

    def _check(self):
        if self.baseline is None or self.done:
            return
        for owner, name, value in self.baseline.values():
            if owner.__dict__.get(name) is not value:
                return self._tampered(getattr(owner, "__name__", "?") + "." + name + " replaced")
        for hook in _WATCHED_HOOKS:
            caller = getattr(self.config.hook, hook, None)
            for impl in caller.get_hookimpls() if caller else ():
                if id(impl) in self.known:
                    continue
                code = getattr(getattr(impl.function, "__func__", impl.function), "__code__", None)
                path = getattr(code, "co_filename", "")
                if (path.startswith(self.rootdir) and path.endswith("/conftest.py")
                        and _os.path.isfile(path)):
                    self.known[id(impl)] = impl  # a conftest.py of the repository, met late
                    continue
                return self._tampered("a " + hook + " hook was added by " + repr(impl.plugin_name))

    def _tampered(self, why):
        self.done = True
        _emit[0]("tamper", why)

    @_pytest_hookimpl(trylast=True)  # after the fixture manager and the others are in
    def pytest_sessionstart(self, session):
        self.baseline = _watched_functions()
        self.known = {id(impl): impl for hook in _WATCHED_HOOKS
                      for impl in getattr(self.config.hook, hook).get_hookimpls()}

    def pytest_runtest_logreport(self, report):
        self._check()
        if self.done:
            return
        if report.when != "call" and report.outcome == "passed":
            return  # a passing setup/teardown says nothing on its own
        if hasattr(report, "wasxfail"):
            outcome = "passed"  # xfail and xpass count as passed, as in SWE-bench's harness
        elif report.outcome == "failed" and report.when != "call":
            outcome = "error"
        else:
            outcome = report.outcome
        _emit[0]("r", report.nodeid, report.when, outcome, report=report)

    @_pytest_hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        _emit[0]("items", session=session)

    def pytest_sessionfinish(self, session, exitstatus):
        self._check()
        if not self.done:
            self.done = True
            _emit[0]("end", int(exitstatus))


def pytest_configure(config):
    # Only the first session reports (pytester's inner runs load plugins again).
    if _emit[0] is None or _registered[0]:
        return
    _registered[0] = True
    reporter = _Reporter(config)
    config.pluginmanager.register(reporter, "rlfleet-reporter")
    _emit[0]("hello")
"""

MARKER = "@@rlfleet-swe "
