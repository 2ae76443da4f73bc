"""Agent demonstrations for stage SWE1: a scripted agent solves each bundled instance
through the real agent tools (OpenSweSession / RunSweTool, the instance's container) and
every turn is recorded with its tool result; the submitted patch is scored with Evaluate.

    python -m rlfleet_swe.demos [--instances DIR] [--out FILE]

starts the swe-runner in process (docker backend) and writes `demonstrations.jsonl`
beside the instances (one trajectory a line). Data prep cuts them into `swe_pivot` rows
(rlfleet_dataprep.swe_pivot). Three scripts per instance, each a different but sensible
route to the gold fix (the edit is read from the instance's gold patch):
- `grep-view-test`: grep for the function, view the file, run the tests, edit, rerun, submit;
- `list-view`: view the repository root, view the file, edit, submit;
- `cat-minimal`: list files, cat the file, an edit of the changed lines only, git diff, submit.

A line: `{"demo_id", "instance_id", "script", "turns": [{"action": {"name", "arguments"},
"result": {"output", "exit_code", "error", "timed_out"}, "files_before"?: {path: text}}],
"patch", "resolved"}`; `files_before` (the edited file before an edit) lets the
`swe_pivot` environment compare edits by their effect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc

from rlfleet_swe.instances import SweInstance, load_instances

TOOLS = {
    "bash": swe_pb2.SWE_TOOL_BASH,
    "view": swe_pb2.SWE_TOOL_VIEW,
    "edit": swe_pb2.SWE_TOOL_EDIT,
    "submit": swe_pb2.SWE_TOOL_SUBMIT,
}
SCRIPTS = ("grep-view-test", "list-view", "cat-minimal")
CALL_TIMEOUT_S = 120.0
TEST_COMMAND = "python3 -B -m pytest -q -p no:cacheprovider tests"
"""-B: no __pycache__ in the work tree (submit's `git add -A` would put .pyc files in the patch)."""


def gold_edit(instance: SweInstance, minimal: bool = False) -> tuple[str, str, str]:
    """(path, old_str, new_str) of a one-file, one-hunk gold patch: the hunk's old and new
    text (with its context lines, or only the changed lines when `minimal`)."""
    lines = instance.patch.splitlines()
    paths = [line[6:] for line in lines if line.startswith("+++ b/")]
    hunks = [i for i, line in enumerate(lines) if line.startswith("@@")]
    if len(paths) != 1 or len(hunks) != 1:
        raise ValueError(f"{instance.instance_id}: the scripted agent needs a one-hunk patch")
    old: list[str] = []
    new: list[str] = []
    for line in lines[hunks[0] + 1 :]:
        tag, text = line[:1], line[1:]
        if tag in (" ", "") and not minimal:
            old.append(text)
            new.append(text)
        elif tag == "-":
            old.append(text)
        elif tag == "+":
            new.append(text)
    return paths[0], "\n".join(old) + "\n", "\n".join(new) + "\n"


def function_name(source: str, old: str) -> str:
    """The name of the function the edit falls in (the last `def` before it)."""
    before = source[: source.index(old)]
    names = re.findall(r"^\s*def (\w+)", before, flags=re.MULTILINE)
    return names[-1] if names else old.split()[0]


def script_actions(script: str, instance: SweInstance, source: str) -> list[dict[str, Any]]:
    """The scripted agent's calls, in order (each `{"name", "arguments"}`)."""
    path, old, new = gold_edit(instance, minimal=script == "cat-minimal")

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"name": name, "arguments": arguments}

    edit = call("edit", path=path, old_str=old, new_str=new)
    if script == "grep-view-test":
        found = call("bash", command=f"grep -rn 'def {function_name(source, old)}' .")
        return [found, call("view", path=path), call("bash", command=TEST_COMMAND), edit,
                call("bash", command=TEST_COMMAND), call("submit")]  # fmt: skip
    if script == "list-view":
        return [call("view", path="."), call("view", path=path), edit, call("submit")]
    if script == "cat-minimal":
        return [call("bash", command="ls"), call("bash", command=f"cat {path}"), edit,
                call("bash", command="git diff"), call("submit")]  # fmt: skip
    raise ValueError(f"unknown script {script!r}; known: {', '.join(SCRIPTS)}")


async def record(
    stub: Any,  # swe_pb2_grpc.SweRunnerServiceStub on an aio channel (typed as sync)
    instance: SweInstance,
    script: str,
    metadata: tuple[tuple[str, str], ...],
) -> dict[str, Any]:
    """One demonstration: the scripted agent's session on `instance`, then Evaluate."""
    opened = await stub.OpenSweSession(
        swe_pb2.SweOpenSessionRequest(
            instance_id=instance.instance_id, image=instance.image, workdir=instance.workdir,
            base_commit=instance.base_commit,
        ),
        metadata=metadata, timeout=CALL_TIMEOUT_S,
    )  # fmt: skip
    session = opened.session_id

    async def run(name: str, arguments: dict[str, Any]) -> swe_pb2.SweRunToolReply:
        request = swe_pb2.SweRunToolRequest(
            session_id=session, tool=TOOLS[name], command=arguments.get("command", ""),
            path=arguments.get("path", ""), old_str=arguments.get("old_str", ""),
            new_str=arguments.get("new_str", ""),
        )  # fmt: skip
        reply: swe_pb2.SweRunToolReply = await stub.RunSweTool(
            request, metadata=metadata, timeout=CALL_TIMEOUT_S
        )
        return reply

    turns: list[dict[str, Any]] = []
    patch = ""
    try:
        path = gold_edit(instance)[0]
        source = (await run("bash", {"command": f"cat {path}"})).output  # not a turn
        for action in script_actions(script, instance, source):
            turn: dict[str, Any] = {"action": action}
            if action["name"] == "edit":
                edited = action["arguments"]["path"]
                before = await run("bash", {"command": f"cat {edited}"})  # not a turn
                turn["files_before"] = {edited: before.output}
            reply = await run(action["name"], action["arguments"])
            if reply.error or reply.timed_out:
                raise RuntimeError(f"{instance.instance_id} {script}: {action} failed: {reply}")
            turn["result"] = {"output": reply.output, "exit_code": reply.exit_code,
                              "error": reply.error, "timed_out": reply.timed_out}  # fmt: skip
            turns.append(turn)
            patch = reply.patch or patch
    finally:
        await stub.CloseSweSession(
            swe_pb2.SweCloseSessionRequest(session_id=session),
            metadata=metadata, timeout=CALL_TIMEOUT_S,
        )  # fmt: skip
    result = await stub.Evaluate(
        swe_pb2.EvaluateRequest(
            instance_id=instance.instance_id, image=instance.image, workdir=instance.workdir,
            patch=patch, test_patch=instance.test_patch, test_command=instance.test_command,
            fail_to_pass=instance.fail_to_pass, pass_to_pass=instance.pass_to_pass,
            timeout_s=CALL_TIMEOUT_S,
        ),
        timeout=CALL_TIMEOUT_S + 60,
    )  # fmt: skip
    return {
        "demo_id": f"{instance.instance_id}/{script}",
        "instance_id": instance.instance_id,
        "script": script,
        "turns": turns,
        "patch": patch,
        "resolved": bool(result.resolved),
    }


async def record_all(
    stub: Any,
    instances: list[SweInstance],
    on_done: Callable[[dict[str, Any]], Awaitable[None] | None] | None = None,
) -> list[dict[str, Any]]:
    """Every script on every instance, one after another (each a container)."""
    metadata = (("x-rlfleet-client-key", "demos-" + secrets.token_hex(8)),)
    demos = []
    for instance in instances:
        for script in SCRIPTS:
            demo = await record(stub, instance, script, metadata)
            demos.append(demo)
            if on_done is not None:
                on_done(demo)
    return demos


def write_demos(demos: list[dict[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in demos))


async def _main(instances_dir: Path, out: Path) -> None:
    from rlfleet_core.client import connect
    from rlfleet_core.testing import running_service

    from rlfleet_swe.images import build_images
    from rlfleet_swe.service import SERVICE

    build_images(instances_dir)
    label = f"rlfleet.swe.runner-demos-{secrets.token_hex(4)}"
    async with (
        running_service(SERVICE, [f"eval.runner_label={label}"]) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        stub = swe_pb2_grpc.SweRunnerServiceStub(channel)
        demos = await record_all(
            stub,
            load_instances(instances_dir / "instances.jsonl"),
            lambda d: print(d["demo_id"], "resolved" if d["resolved"] else "NOT resolved"),
        )
    if not all(d["resolved"] for d in demos):
        raise SystemExit("a demonstration does not resolve its instance; nothing written")
    write_demos(demos, out)
    print(f"wrote {len(demos)} demonstrations to {out}")


def main(argv: list[str] | None = None) -> None:
    from rlfleet_swe.images import bundled_instances_dir

    parser = argparse.ArgumentParser(prog="python -m rlfleet_swe.demos", description=__doc__)
    parser.add_argument("--instances", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    instances_dir = args.instances or bundled_instances_dir()
    asyncio.run(_main(instances_dir, args.out or instances_dir / "demonstrations.jsonl"))


if __name__ == "__main__":
    main()
