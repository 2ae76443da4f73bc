"""The pytest plugin `Evaluate` loads in the container, under a random module name, to
stream each test's outcome to the driver (driver.py says how the stream is checked and
what it cannot stop)."""

from __future__ import annotations

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
