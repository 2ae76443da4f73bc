"""RL data blends: NeMo-Gym-shaped JSONL rows, their validation, the train/val split and
the manifest that lineage records.

A row carries `responses_create_params` (OpenAI Responses create params whose `input`
holds the prompt messages), an environment reference (`env`, or NeMo-Gym's
`agent_ref.name` / `task_source`, mapped through `NEMO_GYM_NAMES`) and the environment's verification fields (`expected_answer`,
`schema_str`, ...). Published blends also ship *placeholder* rows, filled at prep time
from a local copy of the data they reference (`_placeholder: {source: ..., ...}`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet_contracts.run_folder import BLEND_MANIFEST

Row = dict[str, Any]
PLACEHOLDER_KEY = "_placeholder"

MATH_EXTRACTION_FIELD = "extraction"
"""Row field of the `math` environment that picks its answer extraction. The default is
strict (NeMo-Gym parity: the answer must be in `\\boxed{}`); rows whose prompt asks for a
bare answer opt into the lenient extraction with `LENIENT_EXTRACTION`."""
LENIENT_EXTRACTION = "lenient"


class DataError(ValueError):
    """A blend cannot be prepared; the message names the file, line and field."""


@dataclass
class SourceRow:
    path: Path
    lineno: int
    row: Row

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


# NeMo-Gym names -> our environments. NeMo-Gym routes a row by the *agent* that serves it
# (`agent_ref.name` in older rows, `task_source` in what `ng_prepare_data` 0.7 writes), and
# each agent fronts one resources server; both kinds of name are listed. Taken from
# nemo-gym 0.7.0's resources_servers/<server>/configs/*.yaml; docs/reward.md has the table.
# The judge servers: over_refusal_detection and jailbreak_detection are both our `safety`
# (its category read from the row's `safe_prompt` / `adversarial_prompt`; jailbreak agents
# from its nemotron_combined_reward config). Servers we have no environment for: not mapped.
NEMO_GYM_SERVERS: dict[str, tuple[str, tuple[str, ...]]] = {
    # resources server: (our environment, the agent names its configs declare)
    "math_with_judge": ("math", ("math_with_judge_simple_agent",)),
    "mcqa": ("mcqa", ("mcqa_simple_agent",)),
    "structured_outputs": (
        "structured_outputs",
        (
            "structured_outputs_simple_agent",
            "structured_outputs_v3_simple_agent",
            "structured_outputs_v4_simple_agent",
        ),
    ),
    "instruction_following": ("instruction_following", ("instruction_following_simple_agent",)),
    "reasoning_gym": (
        "reasoning_gym",
        (
            "reasoning_gym_simple_agent",
            "reasoning_gym_claude_code_agent",
            "reasoning_gym_claude_code_agent_model_server",
            "reasoning_gym_codex_agent",
            "reasoning_gym_codex_agent_model_server",
            "reasoning_gym_langchain_deepagents_agent_model_server",
            "reasoning_gym_langgraph_agent",
            "reasoning_gym_orchestrator_agent",
            "reasoning_gym_parallel_thinking_agent",
            "reasoning_gym_rewoo_agent",
        ),
    ),
    "code_gen": ("code", ("code_gen_simple_agent",)),
    "over_refusal_detection": ("safety", ()),
    "jailbreak_detection": (
        "safety",
        ("jbb_behaviors_judge_comparison_agent", "jailbreakv28k_transfer_llm_agent"),
    ),
    "single_step_tool_use_with_argument_comparison": (
        "single_step_tool_use_with_argument_comparison",
        (),
    ),
}

NEMO_GYM_NAMES: dict[str, str] = {
    name: env for server, (env, agents) in NEMO_GYM_SERVERS.items() for name in (server, *agents)
}
"""Every NeMo-Gym agent or resources-server name we map, -> our environment."""


@dataclass(frozen=True)
class EnvRef:
    """Where a row names its environment: `env` is ours (after mapping a NeMo-Gym name),
    `field` the row field it came from, `given` that field's value."""

    env: str
    field: str
    given: str


def env_ref(row: Row) -> EnvRef | None:
    """The environment a row names: `env`, else `agent_ref.name`, else `task_source`
    (NeMo-Gym's agent names mapped through `NEMO_GYM_NAMES`, other names kept as they are,
    so `agent_ref: {name: math}` still means `math`); None if the row names none."""
    env = row.get("env")
    if isinstance(env, str) and env:
        return EnvRef(NEMO_GYM_NAMES.get(env, env), "env", env)
    ref = row.get("agent_ref")
    if isinstance(ref, dict) and isinstance(ref.get("name"), str) and ref["name"]:
        name = str(ref["name"])
        return EnvRef(NEMO_GYM_NAMES.get(name, name), "agent_ref.name", name)
    source = row.get("task_source")
    if isinstance(source, str) and source:
        return EnvRef(NEMO_GYM_NAMES.get(source, source), "task_source", source)
    return None


def env_of(row: Row) -> str:
    """The environment a row is scored by (see `env_ref`); '' if it names none."""
    ref = env_ref(row)
    return ref.env if ref else ""


def unknown_env_problem(ref: EnvRef, known_envs: Iterable[str]) -> str:
    """'field: problem' for a row whose environment is not one of `known_envs`."""
    envs = ", ".join(known_envs)
    if ref.field == "env":
        return f"env: unknown environment {ref.given[:100]!r}; one of {envs}"
    agents = ", ".join(sorted(NEMO_GYM_NAMES))
    return (
        f"{ref.field}: {ref.given[:100]!r} is neither one of our environments ({envs}) nor a "
        f"NeMo-Gym agent we map (known: {agents}); set `env` on the row or pass a default"
    )


def prompt_messages(row: Row) -> list[dict[str, Any]]:
    """The prompt as chat messages (a plain-string `input` becomes one user message)."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise DataError("responses_create_params: missing or not an object")
    raw = params.get("input")
    if isinstance(raw, str) and raw.strip():
        return [{"role": "user", "content": raw}]
    if isinstance(raw, list) and raw and all(isinstance(m, dict) and "role" in m for m in raw):
        return raw
    raise DataError(
        "responses_create_params.input: expected a non-empty string or list of messages with a role"
    )


def row_problems(row: Row) -> list[str]:
    """What is wrong with a (filled) row, as 'field: problem' strings; empty if fine."""
    problems = []
    if not env_of(row):
        problems.append(
            "env: missing (set `env`, `agent_ref.name` or `task_source`, or give a default env)"
        )
    try:
        prompt_messages(row)
    except DataError as exc:
        problems.append(str(exc))
    return problems


def read_blend(path: Path) -> Iterator[SourceRow]:
    """Rows of a JSONL file, or of every *.jsonl under a directory (sorted, recursive)."""
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path}: no *.jsonl files in this directory")
    for file in files:
        with file.open() as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{file}:{lineno}: invalid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(
                        f"{file}:{lineno}: expected a JSON object, got {type(row).__name__}"
                    )
                yield SourceRow(file, lineno, row)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split_train_val(rows: list[Row], val_rows: int) -> tuple[list[Row], list[Row]]:
    """The last `val_rows` rows are held out, as the published recipe does."""
    if val_rows < 0:
        raise DataError(f"val_rows ({val_rows}) must be >= 0")
    if len(rows) <= val_rows:
        raise DataError(
            f"the blend has {len(rows)} rows, not more than the {val_rows} held out for validation; "
            "add rows or lower --val-rows"
        )
    cut = len(rows) - val_rows
    return rows[:cut], rows[cut:]


@dataclass
class Manifest:
    blend: str
    sources: dict[str, str]
    """Input file → sha256."""
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)
    """split → {rows, sha256, env_mix}."""
    options: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    """reason → rows dropped, so nothing disappears silently."""

    def to_json(self) -> dict[str, Any]:
        return {
            "blend": self.blend,
            "sources": self.sources,
            "splits": self.splits,
            "options": self.options,
            "dropped": self.dropped,
        }


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_split(out_dir: Path, split: str, rows: Iterable[Row]) -> dict[str, Any]:
    rows = list(rows)
    path = out_dir / split / "data.jsonl"
    _write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return {
        "rows": len(rows),
        "sha256": sha256_file(path),
        "env_mix": dict(sorted(Counter(env_of(r) for r in rows).items())),
    }


def write_manifest(out_dir: Path, manifest: Manifest) -> Path:
    path = out_dir / BLEND_MANIFEST
    _write_atomic(path, json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")
    return path
