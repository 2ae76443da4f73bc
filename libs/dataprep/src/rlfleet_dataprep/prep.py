"""`rlfleet data prep rl <blend>`: blend (JSONL with placeholders) → filled, validated,
split `<out>/<blend>/{train,val}/data.jsonl` plus `manifest.json`."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from rlfleet_contracts.reasoning import (
    LOW_EFFORT_ENV,
    LOW_EFFORT_TEMPLATE_KWARGS,
    row_max_output_tokens,
    row_template_kwargs,
    with_template_kwargs,
)
from rlfleet_contracts.reasoning import to_low_effort as convert_to_low_effort
from rlfleet_contracts.rows import (
    PLACEHOLDER_KEY,
    DataError,
    Manifest,
    Row,
    env_of,
    env_ref,
    read_blend,
    row_problems,
    sha256_file,
    split_train_val,
    write_manifest,
    write_split,
)
from rlfleet_contracts.run_folder import BLEND_MANIFEST

from rlfleet_dataprep.curriculum import Generate, Score, measure, order_by_difficulty
from rlfleet_dataprep.sources import fill_placeholder
from rlfleet_dataprep.swe import is_swe_instance, swe_row

BUNDLED_DIR = Path(__file__).resolve().parent / "blends"
MAX_LISTED_PROBLEMS = 50
"""Bad rows named one by one in the error; the rest are counted."""

RowCheck = Callable[[Row], list[str]]


@dataclass
class CurriculumPass:
    """How `prepare_rl` measures the starting model (see rlfleet_dataprep.curriculum)."""

    generate: Generate
    score: Score
    samples: int
    model: str
    """What was measured (recorded in the manifest)."""
    concurrency: int = 8
    advance: Callable[[int], Any] | None = None
    """Progress per measured prompt."""


@dataclass
class PrepOptions:
    out: Path = Path("data")
    sample: int | None = None
    """Keep N rows (a seeded random subset, original order kept) before the split."""
    seed: int = 0
    val_rows: int = 100
    force: bool = False
    low_effort_fraction: float = 0.0
    """Fraction of training prompts converted to low-effort mode (env `low_effort`)."""
    low_effort_token_budget: int = 256
    reasoning: Literal["keep", "on", "off"] = "keep"
    """Reasoning on/off control, passed to the chat template as `enable_thinking`."""
    token_budget: int | None = None
    """Cap on generated tokens per prompt (`max_output_tokens`)."""
    default_env: str | None = None
    """Environment of rows that name none (no `env`, `agent_ref.name` or `task_source`):
    raw NeMo-Gym rows, whose routing lives in NeMo-Gym's config rather than the row."""

    def check(self) -> None:
        if self.sample is not None and self.sample < 1:
            raise DataError(f"--sample ({self.sample}) must be >= 1")
        if not 0.0 <= self.low_effort_fraction <= 1.0:
            raise DataError(
                f"--low-effort-fraction ({self.low_effort_fraction}) must be within [0, 1]"
            )
        if self.token_budget is not None and self.token_budget < 1:
            raise DataError(f"--token-budget ({self.token_budget}) must be >= 1")


def bundled_blends() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.jsonl"))}


def resolve_blend(blend: str) -> tuple[str, Path]:
    """A path (file or directory) or the name of a bundled blend."""
    path = Path(blend)
    if path.exists():
        return (path.stem if path.is_file() else path.name), path
    bundled = bundled_blends()
    if blend in bundled:
        return blend, bundled[blend]
    raise DataError(
        f"blend {blend!r}: no such file or directory, and no bundled blend of that name "
        f"(bundled: {', '.join(bundled) or 'none'})"
    )


def reward_row_check() -> RowCheck | None:
    """The reward service's row check (its `ServiceDefinition.check_row`, found through the
    `rlfleet.services` entry points and run in this process), or None when rlfleet-reward
    is not installed. In-process rather than a call to a running gateway: a plain prep
    then needs no service, and checks with the environments of the installed version."""
    for ep in entry_points(group="rlfleet.services", name="reward"):
        check: RowCheck | None = ep.load().check_row
        return check
    return None


def resolve_env(row: Row, default_env: str | None) -> Row:
    """The row with `env` set when it was implicit: a NeMo-Gym agent name (mapped) or no
    name at all (`default_env`). Rows that name one of our environments stay as written."""
    ref = env_ref(row)
    if ref is None:
        return {**row, "env": default_env} if default_env else row
    return row if ref.given == ref.env else {**row, "env": ref.env}


def check_rows(sources: list[tuple[str, Row]], check: RowCheck | None) -> None:
    """Every bad row, by file and line, in one DataError (the first MAX_LISTED_PROBLEMS
    named); `check` is the reward service's, else the shape checks of `row_problems`."""
    bad = []
    for where, row in sources:
        problems = row_problems(row) or _control_problems(row) or (check(row) if check else [])
        bad += [f"{where}: {p}" for p in problems]
    if bad:
        listed = bad[:MAX_LISTED_PROBLEMS]
        more = len(bad) - len(listed)
        tail = [f"... and {more} more"] if more else []
        raise DataError(
            f"{len(bad)} problem(s) in the blend's rows:\n" + "\n".join([*listed, *tail])
        )


def _control_problems(row: Row) -> list[str]:
    """The trainer would refuse these reasoning controls at start; say which line now."""
    try:
        row_template_kwargs(row)
        row_max_output_tokens(row)
    except DataError as exc:
        return [str(exc)]
    return []


def to_low_effort(row: Row, token_budget: int) -> Row:
    """Score with the `low_effort` wrapper (correctness traded against generated tokens),
    templated with reasoning on and the template's low-effort switch, as the trainer's
    schedule converts a row (`reasoning.low_effort`)."""
    return convert_to_low_effort(row, token_budget, dict(LOW_EFFORT_TEMPLATE_KWARGS))


def apply_generation_controls(row: Row, options: PrepOptions) -> Row:
    # Low effort is a reasoning mode: --reasoning off must not switch its thinking off.
    if options.reasoning != "keep" and env_of(row) != LOW_EFFORT_ENV:
        row = with_template_kwargs(row, {"enable_thinking": options.reasoning == "on"})
    params = dict(row["responses_create_params"])
    if options.token_budget is not None:
        params["max_output_tokens"] = options.token_budget
    return {**row, "responses_create_params": params}


def prepare_rl(
    blend: str,
    options: PrepOptions,
    advance: Callable[[int], Any] | None = None,
    curriculum: CurriculumPass | None = None,
) -> tuple[Path, Manifest]:
    """Prepare `blend` under options.out; `advance(n)` reports progress per row read.

    With `curriculum`, training prompts the starting model solves in all K samples are
    dropped (counted in the manifest as `solved_by_start_model`) and the rest ordered
    easiest first; train with `data.shuffle=false` to keep that order."""
    options.check()
    name, path = resolve_blend(blend)
    out_dir = options.out / name
    if (out_dir / BLEND_MANIFEST).exists() and not options.force:
        raise DataError(f"{out_dir} is already prepared; pass --force to rebuild it")

    sources: list[tuple[str, Row]] = []
    filled = 0
    for source in read_blend(path):
        row = source.row
        try:
            if PLACEHOLDER_KEY in row:
                row = fill_placeholder(row)
                filled += 1
            elif is_swe_instance(row):  # a raw SWE-bench/SWE-Gym row
                row = swe_row(row)
        except DataError as exc:
            raise DataError(f"{source.where}: {exc}") from None
        sources.append((source.where, resolve_env(row, options.default_env)))
        if advance:
            advance(1)
    check = reward_row_check()
    check_rows(sources, check)
    rows = [row for _, row in sources]

    rng = random.Random(options.seed)
    if options.sample is not None and options.sample < len(rows):
        keep = sorted(rng.sample(range(len(rows)), options.sample))
        rows = [rows[i] for i in keep]
    train, val = split_train_val(rows, options.val_rows)
    dropped: dict[str, int] = {}
    curriculum_info: dict[str, Any] = {}
    if curriculum is not None:
        measured = measure(
            train, curriculum.generate, curriculum.score, curriculum.concurrency, curriculum.advance
        )
        train, solved = order_by_difficulty(train, measured)
        dropped["solved_by_start_model"] = solved
        curriculum_info = {
            "curriculum": {
                "model": curriculum.model,
                "samples": curriculum.samples,
                "measured": len(measured),
                "mean_pass_rate": round(
                    sum(m.pass_rate for m in measured) / max(len(measured), 1), 6
                ),
            }
        }
        if not train:
            raise DataError(
                f"the curriculum pass dropped all {solved} training prompts: the starting "
                f"model ({curriculum.model}) solves every one in all {curriculum.samples} "
                "samples; use a harder blend or a weaker starting model"
            )
    if options.low_effort_fraction > 0:
        chosen = set(rng.sample(range(len(train)), round(len(train) * options.low_effort_fraction)))
        train = [
            to_low_effort(r, options.low_effort_token_budget) if i in chosen else r
            for i, r in enumerate(train)
        ]
    train = [apply_generation_controls(r, options) for r in train]
    val = [apply_generation_controls(r, options) for r in val]

    files = [path] if path.is_file() else sorted(path.rglob("*.jsonl"))
    manifest = Manifest(
        blend=name,
        sources={str(f): sha256_file(f) for f in files},
        options={
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
            "placeholders_filled": filled,
            "row_check": "reward environments" if check else "shape only (no rlfleet-reward)",
            **curriculum_info,
        },
        dropped=dropped,
    )
    manifest.splits["train"] = write_split(out_dir, "train", train)
    manifest.splits["val"] = write_split(out_dir, "val", val)
    write_manifest(out_dir, manifest)
    return out_dir, manifest
