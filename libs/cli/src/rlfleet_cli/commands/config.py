"""`rlfleet config import nemo-rl FILE.yaml`: a NeMo-RL GRPO config as an rlfleet recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rlfleet_core.config import ConfigError

from rlfleet_cli.ui import config_failure, fail, out

config_app = typer.Typer(
    help="Work with configs from other tools (rlfleet config import nemo-rl FILE.yaml).",
    no_args_is_help=True,
)
FORMATS = ("nemo-rl",)


@config_app.command("import")
def import_config(
    source: Annotated[str, typer.Argument(help="The config's tool: nemo-rl.")],
    path: Annotated[Path, typer.Argument(help="Its YAML file (a NeMo-RL GRPO config).")],
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Recipe to write (default: FILE with the suffix .rlfleet.yaml)."
        ),
    ] = None,
) -> None:
    """Map a NeMo-RL GRPO config (its `defaults:` chain and `${...}` references resolved)
    onto an rlfleet stage recipe, validate it, write it, and list every NeMo-RL key that
    has no place in the recipe, with its value. Exits 0 when the recipe was written; a
    recipe that does not validate is one line per problem naming the key (exit 2)."""
    from rlfleet_cli.nemo_rl import import_grpo, load_imported, read_nemo_rl

    if source not in FORMATS:
        raise fail(f"config import {source!r}: expected one of {', '.join(FORMATS)}")
    target = out_path or path.with_name(f"{path.stem}.rlfleet.yaml")
    try:
        imported = import_grpo(read_nemo_rl(path))
        load_imported(imported)
    except ConfigError as exc:
        raise config_failure(exc) from None
    header = (
        f"# Imported from the NeMo-RL config {path} by `rlfleet config import nemo-rl`.\n"
        f"# {len(imported.unmapped)} NeMo-RL keys were not mapped (listed when imported).\n"
    )
    target.write_text(header + yaml.safe_dump(imported.recipe, sort_keys=False))
    out.print(f"wrote {target}", markup=False)
    for key, why in imported.adjusted.items():
        out.print(f"adjusted {key}: {why}", markup=False)
    out.print(f"not mapped ({len(imported.unmapped)} keys):", markup=False)
    for key, value in imported.unmapped.items():
        # One flow-style line per value (a list around it keeps YAML's `...` end mark off).
        shown = yaml.safe_dump([value], default_flow_style=True, width=1 << 20).strip()[1:-1]
        out.print(f"  {key}: {shown}", markup=False)
