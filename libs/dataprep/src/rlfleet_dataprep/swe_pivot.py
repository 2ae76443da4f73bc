"""Stage SWE1 (PivotRL) data: agent demonstrations cut into `swe_pivot` rows.

    python -m rlfleet_dataprep.swe_pivot [--demos FILE] [--sampled FILE] [--out data]

writes `<out>/tiny-swe1/{train,val}/data.jsonl` plus `manifest.json`, the layout every
prepared blend has (tiny/swe1.yaml reads it).

- One row per turn of each demonstration (every decision point, the final submit
  included): the prompt is the demonstration's prefix (system prompt with the tools, the
  task, then each earlier call as an assistant turn `<tool_call>{json}</tool_call>` and
  its result as a `tool` turn, clipped to `MAX_RESULT_CHARS`), the tools ride along in
  `responses_create_params.tools`, and `expected_action` is the demonstrated call
  (`files` holds the edited file before an edit).
- Held out by instance: every row of the last `val_instances` instances (sorted ids) is
  validation, so the held-out reward is measured on repositories training never saw.
- Pivot selection (offline): `--sampled FILE` holds per-row rewards of actions sampled
  from a policy (JSONL, `{"id": row id, "rewards": [..]}` or one `{"id", "reward"}` a
  line). A row is a pivot when its samples have mixed outcomes (some 1, some 0); rows
  whose samples all agree are dropped (counted in the manifest as `not_a_pivot`). Rows
  with no samples, and every row when no file is given, are kept: a GRPO group whose
  samples all score the same has zero advantage and gives no gradient (and
  `grpo.dynamic_sampling` drops it from the batch), so the filter saves rollouts; it
  does not change what a step learns from. `--measure-samples K --rollout-url URL
  --reward HOST:PORT` writes that file first (`<out>/<name>.sampled.jsonl`): K next
  actions per row from an OpenAI-compatible server (the rollout service), scored by the
  reward gateway's `swe_pivot` env (the curriculum pass's sampler and scorer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlfleet_contracts.rows import (
    DataError,
    Manifest,
    Row,
    sha256_file,
    write_manifest,
    write_split,
)

from rlfleet_dataprep.curriculum import (
    CurriculumOptions,
    Generate,
    Score,
    curriculum_services,
    measure,
)

BUNDLED_DEMOS = Path(__file__).resolve().parent / "bundled" / "swe_tiny" / "demonstrations.jsonl"
BUNDLED_INSTANCES = BUNDLED_DEMOS.with_name("instances.jsonl")
BLEND = "tiny-swe1"
ENV = "swe_pivot"
MAX_RESULT_CHARS = 1500
"""A tool result longer than this is clipped in the prompt (head and tail kept)."""

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Work one step at a "
    "time: call exactly one tool per turn, read its result, then decide the next step. "
    "When the fix is done, call submit."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository root.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view",
            "description": "Show a file with line numbers, or list a directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace the one occurrence of old_str in path by new_str "
            "(an empty old_str writes new_str as the whole file).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                },
                "required": ["path", "new_str"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: your changes to the repository are the patch.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The tools described in the system prompt, Hermes style (templates that ignore
    `tools=` still show them; the trainer's single-turn path renders content only). Each
    tool is one compact line (its arguments as name: type) to keep prompts short: the
    full JSON schemas ride in `responses_create_params.tools`."""
    listed = "\n".join(
        json.dumps({
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "arguments": {k: v["type"] for k, v in t["function"]["parameters"]["properties"].items()},
        })
        for t in tools
    )  # fmt: skip
    return (
        f"# Tools\n\nYou may call one of these functions:\n<tools>\n{listed}\n</tools>\n\n"
        "To call one, write a JSON object with its name and arguments inside "
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\n</tool_call>'
    )


def clip(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def call_text(action: Mapping[str, Any]) -> str:
    body = json.dumps({"name": action["name"], "arguments": action["arguments"]})
    return f"<tool_call>\n{body}\n</tool_call>"


def pivot_rows(demo: Mapping[str, Any], instance: Mapping[str, Any]) -> list[Row]:
    """One `swe_pivot` row per turn of a demonstration."""
    workdir = instance.get("workdir", "/testbed")
    messages: list[dict[str, str]] = [
        {"role": "system", "content": f"{SYSTEM_PROMPT}\n\n{tools_text(TOOLS)}"},
        {
            "role": "user",
            "content": f"The repository is at {workdir}.\n\nIssue:\n"
            f"{instance['problem_statement']}",
        },
    ]
    rows: list[Row] = []
    for turn_index, turn in enumerate(demo["turns"]):
        row: Row = {
            "id": f"{demo['demo_id']}#{turn_index}",
            "env": ENV,
            "instance_id": demo["instance_id"],
            "turn": turn_index,
            "expected_action": turn["action"],
            "workdir": workdir,
            "responses_create_params": {"input": [dict(m) for m in messages], "tools": TOOLS},
        }
        if turn.get("files_before"):
            row["files"] = turn["files_before"]
        rows.append(row)
        result = turn["result"]
        output = result["output"] or f"(exit code {result['exit_code']}, no output)"
        messages += [
            {"role": "assistant", "content": call_text(turn["action"])},
            {"role": "tool", "content": clip(output)},
        ]
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(value, dict):
            raise DataError(f"{path}:{number}: expected a JSON object")
        rows.append(value)
    return rows


def read_sampled(path: Path) -> dict[str, list[float]]:
    """Row id -> sampled rewards, from `{"id", "rewards": [..]}` or `{"id", "reward"}` lines."""
    sampled: dict[str, list[float]] = defaultdict(list)
    for number, line in enumerate(read_jsonl(path), start=1):
        row_id, rewards = line.get("id"), line.get("rewards", [line.get("reward")])
        if (
            not isinstance(row_id, str)
            or not isinstance(rewards, list)
            or not all(isinstance(r, int | float) and not isinstance(r, bool) for r in rewards)
        ):
            raise DataError(
                f"{path}:{number}: expected {{'id': str, 'rewards': [numbers]}} "
                "or {'id': str, 'reward': number}"
            )
        sampled[row_id] += [float(r) for r in rewards]
    return dict(sampled)


def select_pivots(
    rows: Iterable[Row], sampled: Mapping[str, list[float]] | None
) -> tuple[list[Row], dict[str, int]]:
    """(rows kept, counts): a row with samples is kept only when they disagree."""
    kept, counts = [], {"pivot": 0, "not_a_pivot": 0, "unsampled": 0}
    for row in rows:
        rewards = (sampled or {}).get(row["id"])
        if not rewards:
            counts["unsampled"] += 1
            kept.append(row)
        elif min(rewards) < max(rewards):
            counts["pivot"] += 1
            kept.append(row)
        else:
            counts["not_a_pivot"] += 1
    return kept, counts


def split_by_instance(rows: list[Row], val_instances: int) -> tuple[list[Row], list[Row]]:
    ids = sorted({r["instance_id"] for r in rows})
    if not 0 < val_instances < len(ids):
        raise DataError(
            f"val_instances ({val_instances}) must be at least 1 and below the {len(ids)} instances"
        )
    held = set(ids[-val_instances:])
    return [r for r in rows if r["instance_id"] not in held], [
        r for r in rows if r["instance_id"] in held
    ]


def prepare_swe_pivot(
    out: Path,
    *,
    demos_path: Path = BUNDLED_DEMOS,
    instances_path: Path = BUNDLED_INSTANCES,
    sampled_path: Path | None = None,
    val_instances: int = 1,
    name: str = BLEND,
    sampler: tuple[Generate, Score] | None = None,
) -> tuple[Path, Manifest]:
    """Cut the demonstrations into pivot rows under `<out>/<name>` (see the docstring)."""
    instances = {i["instance_id"]: i for i in read_jsonl(instances_path)}
    rows: list[Row] = []
    for demo in read_jsonl(demos_path):
        if not demo.get("resolved"):
            raise DataError(f"{demos_path}: {demo.get('demo_id')} does not resolve its instance")
        instance = instances.get(demo["instance_id"])
        if instance is None:
            raise DataError(f"{demos_path}: {demo['demo_id']}: unknown instance")
        rows += pivot_rows(demo, instance)
    from rlfleet_dataprep.prep import check_rows, reward_row_check

    check_rows([(str(r["id"]), r) for r in rows], reward_row_check())
    if sampler is not None:  # measure the policy now; the file is kept as a source
        sampled_path = out / f"{name}.sampled.jsonl"
        out.mkdir(parents=True, exist_ok=True)
        measured = measure(rows, *sampler, concurrency=4)
        sampled_path.write_text(
            "".join(
                json.dumps({"id": rows[m.index]["id"], "rewards": list(m.rewards)}) + "\n"
                for m in measured
            )
        )
    sampled = read_sampled(sampled_path) if sampled_path is not None else None
    kept, counts = select_pivots(rows, sampled)
    if not kept:
        raise DataError(
            f"no pivots: the samples of every one of the {len(rows)} turns agree "
            f"({sampled_path}); sample more, or at a higher temperature"
        )
    train, val = split_by_instance(kept, val_instances)
    out_dir = out / name
    sources = [demos_path, instances_path, *([sampled_path] if sampled_path else [])]
    manifest = Manifest(
        blend=name,
        sources={str(p): sha256_file(p) for p in sources},
        options={
            "val_instances": val_instances,
            "pivots": counts,
            "held_out": sorted({r["instance_id"] for r in val}),
        },
        dropped={"not_a_pivot": counts["not_a_pivot"]},
    )
    manifest.splits["train"] = write_split(out_dir, "train", train)
    manifest.splits["val"] = write_split(out_dir, "val", val)
    write_manifest(out_dir, manifest)
    return out_dir, manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rlfleet_dataprep.swe_pivot", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--demos", type=Path, default=BUNDLED_DEMOS)
    parser.add_argument("--instances", type=Path, default=BUNDLED_INSTANCES)
    parser.add_argument("--sampled", type=Path, default=None)
    parser.add_argument("--val-instances", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--name", default=BLEND)
    parser.add_argument("--measure-samples", type=int, default=0, metavar="K")
    parser.add_argument("--rollout-url", default="", help="OpenAI-compatible server")
    parser.add_argument(
        "--rollout-send-token",
        action="store_true",
        help="send the fleet token to a --rollout-url beyond loopback too",
    )
    parser.add_argument("--reward", default="", help="reward gateway host:port")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    try:
        with contextlib.ExitStack() as stack:
            sampler = None
            if args.measure_samples:
                if not args.rollout_url or not args.reward:
                    raise DataError("--measure-samples needs --rollout-url and --reward")
                options = CurriculumOptions(args.measure_samples, args.temperature,
                                            args.max_tokens)  # fmt: skip
                options.check()
                sampler = stack.enter_context(curriculum_services(
                    options, rollout_url=args.rollout_url, reward_target=args.reward,
                    send_token_anywhere=args.rollout_send_token,
                ))  # fmt: skip
            out_dir, manifest = prepare_swe_pivot(
                args.out, demos_path=args.demos, instances_path=args.instances,
                sampled_path=args.sampled, val_instances=args.val_instances, name=args.name,
                sampler=sampler,
            )  # fmt: skip
    except DataError as exc:
        raise SystemExit(f"error: {exc}") from None
    splits = {k: v["rows"] for k, v in manifest.splits.items()}
    print(f"wrote {out_dir}: {splits}, pivots {manifest.options['pivots']}")


if __name__ == "__main__":
    main()
