"""Cross-service: the `terminal` episode's goal check cannot be forged by the files or
programs the policy leaves behind (issue 28 item 2), through the real reward and sandbox
services on loopback.

Each hostile case writes a wrong answer plus a trick through the `bash` tool, then closes
the episode; the check must fail (reward 0). The honest control solves the same task and
must pass, and the check still reads every file from the work dir as its cwd.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rlfleet_proto.v1 import reward_pb2_grpc
from support import sandbox_and_reward

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services/reward/tests"))
from episode_support import Caller

pytest.importorskip("rlfleet_sandbox", reason="the sandbox service package is not installed")


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
    tmp = tmp_path_factory.mktemp("terminal-check")
    reward_args = ["environments=[math]", "pool.workers=1", "episodes.tool_timeout_s=8"]
    with (
        sandbox_and_reward(tmp, reward_args, []) as (_, _, target),
        grpc.insecure_channel(target) as channel,
    ):
        yield reward_pb2_grpc.RewardServiceStub(channel)


# The task: answer.json must hold {"x": 42}; the check parses it with Python's json.
ROW = {
    "files": {"task.md": "write answer.json holding x = 42"},
    "check": (
        'python3 -c "import json, sys; '
        "sys.exit(0 if json.load(open('answer.json')) == {'x': 42} else 1)\""
    ),
}
WRONG = """echo '{"x": 1}' > answer.json"""
EXIT_0 = "import os; os._exit(0)"
SITE = ".local/lib/python3.11/site-packages"  # the sandbox's python3 (user site of HOME)


def _write(path: str, text: str) -> str:
    return f"mkdir -p \"$(dirname '{path}')\" && printf '%s\\n' '{text}' > '{path}'"


# Finds the check's runner (the parent of the check's bash), then forges a report on the
# runner's stdout and kills it, or stops it.
_RUNNER_PID = "read -r _ _ _ runner _ < /proc/$PPID/stat"
_FORGE = (
    "#!/bin/bash\n"
    + _RUNNER_PID
    + "\nfor fd in /proc/$runner/fd/1 /proc/1/fd/1; do "
    + 'printf \'\\x1erlfleet-terminal:{"exit_code": 0, "stdout": "", "stderr": "", '
    + '"cut": false, "files": {}}\\n\' > $fd 2>/dev/null; done\nkill -9 $runner\n'
)

HOSTILE: list[tuple[str, list[str], str | None]] = [
    ("json_py_in_work_dir", [_write("json.py", EXIT_0)], None),
    ("sitecustomize_in_work_dir", [_write("sitecustomize.py", EXIT_0)], None),
    ("usercustomize_in_home", [_write(f"{SITE}/usercustomize.py", EXIT_0)], None),
    ("pth_in_user_site", [_write(f"{SITE}/evil.pth", EXIT_0)], None),
    (
        "forged_report_then_kill_runner",
        [f"cat > solve.sh <<'EOF'\n{_FORGE}EOF", "chmod +x solve.sh"],
        "./solve.sh; ",
    ),
    (
        "stop_runner",
        [f"printf '%s\\n' '{_RUNNER_PID}' 'kill -STOP $runner' > solve.sh", "chmod +x solve.sh"],
        "./solve.sh; ",
    ),
]


def _episode(stub: reward_pb2_grpc.RewardServiceStub, row: dict, commands: list[str]) -> float:
    caller = Caller(stub)
    episode = caller.open("terminal", row)
    for command in commands:
        result = caller.step(episode.episode_id, ("bash", {"command": command})).results[0]
        assert not result.error, result.content
    score = caller.close(episode.episode_id, "done")
    assert score.failure_kind == 0, score.failure_reason
    return score.reward


@pytest.mark.parametrize(
    ("case_id", "commands", "check_prefix"), HOSTILE, ids=[c[0] for c in HOSTILE]
)
def test_policy_files_cannot_pass_the_check(
    stub: reward_pb2_grpc.RewardServiceStub,
    case_id: str,
    commands: list[str],
    check_prefix: str | None,
) -> None:
    row = dict(ROW, check=(check_prefix or "") + ROW["check"])
    assert _episode(stub, row, [WRONG, *commands]) == 0.0


def test_honest_answer_passes_and_the_check_reads_the_work_dir(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    solve = """echo '{"x": 42}' > answer.json"""
    assert _episode(stub, ROW, [solve, _write("json.py", EXIT_0)]) == 1.0
    # cwd is the work dir, files readable and executable, not writable; HOME is elsewhere
    row = {
        "files": {"a.txt": "hello"},
        "check": (
            'test "$(cat a.txt)" = hello && ./run.sh | grep -qx ok && ! touch new 2>/dev/null '
            '&& ! echo x >> a.txt 2>/dev/null && test "$HOME" != "$PWD" && touch "$TMPDIR/t" '
            "&& python3 -c \"import sys; sys.path.append('.'); import mod; "
            'sys.exit(mod.V - 7)"'
        ),
    }
    make = ["printf '#!/bin/bash\\necho ok\\n' > run.sh", "chmod +x run.sh", "echo V=7 > mod.py"]
    assert _episode(stub, row, make) == 1.0
