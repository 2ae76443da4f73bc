"""`rlfleet-trainer eval --model M --out DIR -c a.yaml -c b.yaml ...`: one set of weights
measured on several recipes' held-out sets, as each recipe validates (same prompts,
samples, temperature and scorers), against the running rollout and reward services.

`rlfleet run` uses it at the end of a pipeline: the final export on every earlier stage's
held-out set, to see what later stages cost the earlier ones (the regression table). The
weights are published to the rollout once, under a version newer than any it has seen;
each recipe's result goes to <DIR>/<recipe's stage>/heldout.json (label `final`) with its
samples beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.config import ConfigError, load_config

LABEL = "final"


async def evaluate(
    model: str, recipes: list[RecipeConfig], out: Path
) -> dict[str, dict[str, float]]:
    """Publish `model` to the rollout, then validate each recipe; returns stage → result."""
    from rlfleet_trainer.context import build_context
    from rlfleet_trainer.data import PromptSource, read_rows
    from rlfleet_trainer.loop import publish_weights
    from rlfleet_trainer.validation import validate, write_heldout

    first = recipes[0].model_copy(
        update={"policy": recipes[0].policy.model_copy(update={"model": model})}
    )
    val_sets = [read_rows(r.data.val_path) if r.data.val_path else [] for r in recipes]
    for recipe, rows in zip(recipes, val_sets, strict=True):
        if not rows:
            raise ValueError(f"{recipe.stage}: data.val_path names no held-out rows")
    # The context's training rows are never drawn from: the first held-out set stands in.
    ctx = build_context(first, out / "_weights", rows=val_sets[0], val_rows=[])
    results: dict[str, dict[str, float]] = {}
    try:
        version = await ctx.rollout.weight_version() + 1
        await publish_weights(ctx, version)
        for recipe, val_rows in zip(recipes, val_sets, strict=True):
            stage_dir = out / recipe.stage
            stage_dir.mkdir(parents=True, exist_ok=True)
            source = PromptSource.from_recipe(
                recipe, val_rows, ctx.tokenizer, False, weighted=False
            )
            stage_ctx = replace(ctx, recipe=recipe, val_source=source, run_dir=stage_dir)
            result = await validate(stage_ctx, LABEL)
            write_heldout(stage_ctx.folder, LABEL, result)
            results[recipe.stage] = {**result.metrics, "weight_version": float(version)}
    finally:
        await ctx.rollout.close()
        await ctx.reward.close()
    return results


async def win_rate(recipe: RecipeConfig, stage_dir: Path) -> dict[str, float]:
    """The stage's held-out answers after training judged against its answers before (its
    starting weights), pair by pair on the same prompts, by the recipe's own scorer (a
    GenRM environment ranks the two): wins + ties / 2 over the pairs it judged."""
    from rlfleet_contracts.reward_client import RewardClient
    from rlfleet_core.calls import CallFailed, CallRetry
    from rlfleet_core.models import resolve_model
    from transformers import AutoTokenizer

    from rlfleet_trainer.data import PromptSource, read_rows

    if not recipe.data.val_path:
        raise ValueError(f"{recipe.stage}: data.val_path names no held-out rows")
    folder = StageFolder(stage_dir)
    answers = {label: _answers(folder.heldout_samples(label)) for label in ("before", "after")}
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(recipe.policy.model))
    source = PromptSource.from_recipe(
        recipe, read_rows(recipe.data.val_path), tokenizer, False, weighted=False
    )
    services = recipe.services
    retry = CallRetry(services.call_attempts, services.retry_backoff_s)
    reward = RewardClient(services.reward, services.score_timeout_s, retry)
    counts = {"wins": 0.0, "ties": 0.0, "losses": 0.0, "unjudged": 0.0}
    try:
        for (index, k), before in sorted(answers["before"].items()):
            after = answers["after"].get((index, k))
            if after is None:
                continue
            prompt = source.prompt_at(index)
            try:
                group = await reward.score_samples(
                    f"winrate-{index}-{k}",
                    prompt.env,
                    prompt.row_json,
                    [after, before],
                    [len(tokenizer.encode(t)) for t in (after, before)],
                )
            except CallFailed:
                counts["unjudged"] += 1
                continue
            new, old = group.scores
            if new is None or old is None:
                counts["unjudged"] += 1
            elif abs(new.reward - old.reward) < 1e-9:
                counts["ties"] += 1
            else:
                counts["wins" if new.reward > old.reward else "losses"] += 1
    finally:
        await reward.close()
    judged = counts["wins"] + counts["ties"] + counts["losses"]
    result = {
        **counts,
        "pairs": judged,
        "win_rate": (counts["wins"] + counts["ties"] / 2) / judged if judged else float("nan"),
    }
    folder.win_rate.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _answers(path: Path) -> dict[tuple[int, int], str]:
    """(prompt index, sample number) -> text, for the samples that were scored."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no held-out samples (the stage validates before and after)"
        )
    out: dict[tuple[int, int], str] = {}
    seen: dict[int, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        index = int(sample["prompt"])
        k = seen[index] = seen.get(index, -1) + 1
        if sample.get("reward") is not None:
            out[(index, k)] = str(sample["text"])
    return out


def eval_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rlfleet-trainer eval",
        description="Measure one set of weights on the held-out sets of several recipes "
        "(each as its stage validates) against running rollout and reward services.",
    )
    parser.add_argument("--model", help="weights: a HF folder or model name")
    parser.add_argument(
        "--win-rate",
        type=Path,
        metavar="STAGE_DIR",
        help="instead: judge the stage's held-out answers after against before with its "
        "recipe's scorer (-c, once) and write STAGE_DIR/genrm_win_rate.json",
    )
    parser.add_argument("--out", type=Path, help="results folder")
    parser.add_argument(
        "-c", "--config", action="append", required=True, help="recipe YAML (repeatable)"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="applied to every recipe")
    args = parser.parse_args(argv)
    try:
        recipes = [load_config(RecipeConfig, path, list(args.overrides)) for path in args.config]
    except ConfigError as exc:
        for line in exc.lines:
            print(f"rlfleet-trainer eval: config error: {line}", file=sys.stderr)
        return 2
    try:
        if args.win_rate is not None:
            rate = asyncio.run(win_rate(recipes[0], args.win_rate))
            print(
                f"{recipes[0].stage}: win rate vs the start {rate['win_rate']:.3f} "
                f"over {rate['pairs']:.0f} pairs ({rate['unjudged']:.0f} unjudged)"
            )
            return 0
        if args.model is None or args.out is None:
            parser.error("--model and --out are required (or --win-rate STAGE_DIR)")
        results = asyncio.run(evaluate(args.model, recipes, args.out))
    except (ValueError, FileNotFoundError) as exc:
        print(f"rlfleet-trainer eval: error: {exc}", file=sys.stderr)
        return 1
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    for stage, result in results.items():
        print(f"{stage}: held-out reward {result.get('reward', float('nan')):.3f}")
    return 0


__all__ = ["LABEL", "eval_main", "evaluate", "win_rate"]
