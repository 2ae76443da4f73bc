"""Patches that try to make wrong code score as resolved, through the real service and
docker (issue 28): none fixes tinystats' median, each attacks how the result is reported
or how the tests run. Two channels stop them (driver.py): the driver's check of the applied
tree before any patch code runs, and the report stream from the plugin to the driver
(HMAC'd lines, checked against pytest's own frames, read by a process the tests cannot
reach). Each attack class is one container run; the tree attacks are also run with the
service's diff-text check turned off, so the driver's check is shown to stand on its own."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe import evaluate
from rlfleet_swe.results import patch_paths, touches_test_machinery
from swe_testlib import host_checkout, instances, request_for

INSTANCE = {i.instance_id: i for i in instances()}["rlfleet__tinystats-1"]
FAIL_TO_PASS = INSTANCE.fail_to_pass
REQUIRED = [*INSTANCE.fail_to_pass, *INSTANCE.pass_to_pass]
PROTECTED = evaluate.EvalConfig().protected_files


def _with_core_prefix(tmp: Path, attack: str) -> str:
    """A patch that runs `attack` when tinystats.core is imported (while pytest collects the
    tests) and leaves the bug in place."""
    repo = host_checkout(INSTANCE, tmp)
    core = repo / "tinystats/core.py"
    core.write_text(attack + "\n" + core.read_text())
    return _diff(repo)


def _diff(repo: Path, *args: str) -> str:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, timeout=30)
    done = subprocess.run(["git", "diff", "--cached", "--binary", *args], cwd=repo,
                          capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    return done.stdout


FORGED_JSON = "{" + ", ".join(f'"{n}": "passed"' for n in REQUIRED) + "}"

# Code run inside the pytest process (at import of the patched module).
RUNTIME_ATTACKS = {
    # (a) of issue 28: an atexit hook rewrites the report file after the plugin wrote it;
    # here also forged lines to every fd of the process, and a forked child and a thread
    # that keep writing after the session ends, and a signal handler that would.
    "atexit_fork_thread_signal": (
        "import atexit, os, signal, threading, time\n"
        f"_forged = {FORGED_JSON!r}\n"
        "_lines = ''.join(f'{i}\\tr\\t{n}\\tcall\\tpassed\\t' + '0' * 64 + '\\n' for i, n in "
        f"enumerate({REQUIRED!r}))\n"
        "def _spray():\n"
        "    for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "        try: os.write(fd, _lines.encode())\n"
        "        except OSError: pass\n"
        "    path = os.environ.get('RLFLEET_SWE_REPORT')\n"
        "    if path: open(path, 'w').write(_forged)\n"
        "atexit.register(_spray)\n"
        "signal.signal(signal.SIGTERM, lambda *a: _spray())\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), _spray()), daemon=True).start()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    for _ in range(50):\n"
        "        time.sleep(0.1); _spray()\n"
        "    os._exit(0)\n"
    ),
    # (b): the plugin's module-level store, and anything that looks like the plugin's
    # sender, found through sys.modules; then a clean exit before the real tests run.
    "plugin_via_sys_modules": (
        "import os, sys\n"
        "for _m in list(sys.modules.values()):\n"
        "    _store = getattr(_m, '_outcomes', None)\n"
        "    if isinstance(_store, dict):\n"
        f"        _store.update({{n: 'passed' for n in {REQUIRED!r}}})\n"
        "    _send = getattr(_m, '_emit', None)\n"
        "    if isinstance(_send, list) and _send and callable(_send[0]):\n"
        f"        for _n in {REQUIRED!r}:\n"
        "            _send[0]('r', _n, 'call', 'passed')\n"
        "        _send[0]('end', 0)\n"
        "        os._exit(0)\n"
    ),
    # The reporter object found through gc and fed forged TestReports, then the end of
    # session, then a clean exit.
    "reporter_via_gc": (
        "import gc, os\n"
        "from _pytest.reports import TestReport\n"
        "for _o in gc.get_objects():\n"
        "    if type(_o).__name__ == '_Reporter':\n"
        f"        for _n in {REQUIRED!r}:\n"
        "            _o.pytest_runtest_logreport(TestReport(_n, (_n, 0, _n), {}, 'passed', None,"
        " 'call'))\n"
        "        _o.pytest_sessionfinish(None, 0)\n"
        "        os._exit(0)\n"
    ),
    # A conftest-style hookwrapper registered from code instead of a file.
    "hook_registered_at_runtime": (
        "import gc, pytest\n"
        "from _pytest.config import Config\n"
        "class _Flip:\n"
        "    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        outcome = yield\n"
        "        report = outcome.get_result()\n"
        "        report.outcome, report.longrepr = 'passed', None\n"
        "for _o in gc.get_objects():\n"
        "    if isinstance(_o, Config):\n"
        "        _o.pluginmanager.register(_Flip(), 'flip')\n"
    ),
    # pytest's own machinery changed: every test body becomes a no-op.
    "pytest_internals_patched": (
        "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"
    ),
    # pytest made to stop before the tests run, with exit code 0.
    "pytest_exit_early": "import pytest\npytest.exit('done', returncode=0)\n",
    "os_exit_early": "import os\nos._exit(0)\n",
}


EXPECTED_ERROR = {
    "atexit_fork_thread_signal": "not the plugin's (bad HMAC)",
    "plugin_via_sys_modules": "pytest's runner did not make for a collected test",
    "reporter_via_gc": "pytest's runner did not make for a collected test",
    "hook_registered_at_runtime": "a pytest_runtest_makereport hook was added by 'flip'",
    "pytest_internals_patched": "Function.runtest replaced",
    "pytest_exit_early": "required tests did not run",
    "os_exit_early": "the test run did not finish",
}


@pytest.mark.parametrize("attack", sorted(RUNTIME_ATTACKS))
async def test_runtime_attacks_on_the_report_do_not_resolve(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path, attack: str
) -> None:
    patch = _with_core_prefix(tmp_path, RUNTIME_ATTACKS[attack])
    result = await stub.Evaluate(request_for(INSTANCE, patch, timeout_s=60), timeout=120)
    assert result.status == swe_pb2.EVAL_STATUS_COMPLETED, (result.error, result.log_tail)
    assert not result.resolved, (result.error, result.log_tail)
    outcomes = {t.name: t.outcome for t in result.tests}
    assert all(outcomes[name] != swe_pb2.TEST_OUTCOME_PASSED for name in FAIL_TO_PASS)
    assert result.error, "a run that was tampered with or cut short says so"
    assert EXPECTED_ERROR[attack] in result.error, result.error


def _root_file(name: str, text: str = "x = 1\n") -> Callable[[Path], None]:
    def make(repo: Path) -> None:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)

    return make


# A pytest plugin that reports every test as passed: loaded at start-up through a
# `pytest11` entry point of package metadata found on sys.path (the repository's root is
# on it under `python3 -m pytest`), before the report plugin takes its baseline.
PASS_EVERYTHING = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


def _entry_point(folder: str, metadata: str) -> Callable[[Path], None]:
    def make(repo: Path) -> None:
        (repo / "tinystats/_plug.py").write_text(PASS_EVERYTHING)
        (repo / folder).mkdir(parents=True)
        (repo / folder / metadata).write_text("Metadata-Version: 2.1\nName: plug\nVersion: 1\n")
        (repo / folder / "entry_points.txt").write_text("[pytest11]\nplug = tinystats._plug\n")

    return make


def _fixed_copy_in_tests(repo: Path) -> None:
    # tests/ comes first on sys.path (pytest's prepend mode), so `from tinystats.core import
    # median` would import this fixed copy while the real package keeps the bug.
    subprocess.run(["cp", "-r", "tinystats", "tests/tinystats"], cwd=repo, check=True, timeout=30)
    fix = INSTANCE.patch.replace(" a/tinystats/", " a/tests/tinystats/").replace(
        " b/tinystats/", " b/tests/tinystats/"
    )
    subprocess.run(["git", "apply", "-"], input=fix.encode(), cwd=repo, check=True, timeout=30)


def _symlink(repo: Path) -> None:
    os.symlink("../tests", repo / "tinystats/helpers")


def _rename_into_conftest(repo: Path) -> None:
    subprocess.run(["git", "mv", "tinystats/__init__.py", "tests/conftest.py"], cwd=repo,
                   check=True, timeout=30)  # fmt: skip


def _edit_test(repo: Path) -> None:
    path = repo / "tests/test_core.py"
    path.write_text(path.read_text().replace("assert", "assert True or"))


# Changes to the tree that would let the patch's code run before, or instead of, pytest or
# the report plugin, or change which tests run: refused before anything runs.
TREE_ATTACKS: dict[str, Callable[[Path], None]] = {
    "pytest_py_shadows_pytest": _root_file("pytest.py", "import sys\nsys.exit(0)\n"),
    "underscore_pytest_package": _root_file("_pytest/__init__.py"),
    "pluggy_py": _root_file("pluggy.py"),
    "py_py": _root_file("py.py"),
    "stdlib_json_in_tests": _root_file("tests/json.py"),
    "stdlib_package_in_src": _root_file("src/argparse/__init__.py"),
    "pth_file": _root_file("tinystats/zz.pth", "import os\n"),
    "sitecustomize": _root_file("sitecustomize.py"),
    "pyproject_addopts": _root_file("pyproject.toml", "[tool.pytest.ini_options]\naddopts='-x'\n"),
    "setup_cfg": _root_file("setup.cfg", "[tool:pytest]\naddopts = -p no:rlfleet\n"),
    "tox_ini": _root_file("tox.ini", "[pytest]\naddopts = -x\n"),
    "dot_pytest_ini": _root_file(".pytest.ini", "[pytest]\naddopts = -p no:rlfleet\n"),
    "pytest_toml_in_tests": _root_file("tests/pytest.toml", "[pytest]\naddopts = ['-x']\n"),
    "dist_info_entry_point": _entry_point("plug-1.dist-info", "METADATA"),
    "egg_info_entry_point": _entry_point("src/plug.egg-info", "PKG-INFO"),
    "egg_dir_entry_point": _entry_point("plug.egg/EGG-INFO", "PKG-INFO"),
    "pyc_beside_the_tests": _root_file("tests/__pycache__/test_core.cpython-311.pyc"),
    "init_in_test_dir": _root_file("tests/__init__.py"),
    "fixed_copy_of_the_package_in_tests": _fixed_copy_in_tests,
    "conftest_with_space_in_path": _root_file('tests/a b\\c"d/conftest.py'),
    "symlink": _symlink,
    "rename_into_conftest": _rename_into_conftest,
    "edit_existing_test": _edit_test,
}


@pytest.fixture(params=[True, False], ids=["text-check", "tree-check-only"])
def text_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """With False, the service's diff-text check is off: the driver's check of the applied
    tree is the only one left (what a diff the text check misreads would meet)."""
    if not request.param:
        monkeypatch.setattr(evaluate, "touches_test_machinery", lambda *args: [])
    return bool(request.param)


async def test_tree_attacks_are_refused(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path, text_check: bool
) -> None:
    for name, make in TREE_ATTACKS.items():
        repo = host_checkout(INSTANCE, tmp_path / name)
        make(repo)
        patch = _diff(repo, "-M")
        result = await stub.Evaluate(request_for(INSTANCE, patch, timeout_s=60), timeout=120)
        assert result.status == swe_pb2.EVAL_STATUS_PATCH_FAILED, (name, result.error,
                                                                   result.log_tail)  # fmt: skip
        assert not result.resolved and "test machinery" in result.error, (name, result.error)


def test_text_check_reads_quoted_headers() -> None:
    """(c) of issue 28: git C-quotes a name with spaces, quotes, backslashes or non-ASCII
    bytes (octal escapes); the old regex read `"a/tests/conftest.py"` as some other path."""
    quoted = (
        'diff --git "a/tests/conf\\164est.py" "b/tests/conf\\164est.py"\n'
        "new file mode 100644\n--- /dev/null\n"
        '+++ "b/tests/conf\\164est.py"\n@@ -0,0 +1 @@\n+x = 1\n'
    )
    assert "tests/conftest.py" in patch_paths(quoted)
    assert touches_test_machinery(quoted, "", PROTECTED) != []
    spaced = 'diff --git "a/my dir/setup.cfg" "b/my dir/setup.cfg"\n'
    assert "my dir/setup.cfg" in patch_paths(spaced)
    unquoted_space = "diff --git a/my dir/tox.ini b/my dir/tox.ini\n"
    assert touches_test_machinery(unquoted_space, "", PROTECTED) != []
    renamed = 'rename from tinystats/x.py\nrename to "tests/\\303\\251/conftest.py"\n'
    assert "tests/é/conftest.py" in patch_paths(renamed)
    # The test patch's own files, quoted in one diff and not in the other.
    test_patch = "diff --git a/tests/test_a.py b/tests/test_a.py\n"
    patch = 'diff --git "a/tests/test_\\141.py" "b/tests/test_\\141.py"\n'
    assert touches_test_machinery(patch, test_patch, []) != []
