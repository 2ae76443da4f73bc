"""`rlfleet-trainer`: serve the trainer (same flags as `rlfleet serve trainer`), or
`rlfleet-trainer run -c recipe.yaml --run-dir DIR [--resume] [--rows rows.jsonl] [k=v ...]`
to train one stage in this process (`rlfleet-trainer eval ...`: one set of weights on
several recipes' held-out sets, rlfleet_trainer.evaluate) — or, under torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT in the environment), as one rank of a data-parallel stage."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.startup import check_start
from rlfleet_core.config import ConfigError, format_override, load_config
from rlfleet_core.logs import setup_logging


def run_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rlfleet-trainer run",
        description="Train one GRPO stage from a recipe. Several ranks: launch under torchrun "
        "(`python -m torch.distributed.run --nproc-per-node N -m rlfleet_trainer run ...`) or "
        "srun exporting RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; rank 0 talks "
        "to the services and sends each step's batch to the others. A rank that torchrun "
        "restarts (TORCHELASTIC_RESTART_COUNT > 0) resumes from the latest checkpoint.",
    )
    parser.add_argument("-c", "--config", help="recipe YAML")
    parser.add_argument("--run-dir", required=True, type=Path, help="run folder")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint (implied when torchrun restarts the ranks)",
    )
    parser.add_argument("--rows", help="training rows JSONL (overrides data.train_path)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.rows:
        overrides.append(format_override("data.train_path", args.rows))
    try:
        recipe = load_config(RecipeConfig, args.config, overrides)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"rlfleet-trainer run: config error: {line}", file=sys.stderr)
        return 2
    from rlfleet_core.models import ModelNotFound

    from rlfleet_trainer.checkpoint import CheckpointDiskFull
    from rlfleet_trainer.ranks import env_rank_info, init_distributed
    from rlfleet_trainer.run import run_stage

    try:
        info = env_rank_info()
        setup_logging("trainer" if info.world_size == 1 else f"trainer.rank{info.rank}")
        init_distributed()
    except (ValueError, RuntimeError) as exc:
        print(f"rlfleet-trainer run: error: {exc}", file=sys.stderr)
        return 1
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    code = 1
    try:
        # the checks `rlfleet rl --dry-run` runs, before any model load
        check_start(recipe, info.world_size)
        state = asyncio.run(run_stage(recipe, args.run_dir, resume=args.resume or restarted))
        code = 0
    except (ValueError, FileNotFoundError, ModelNotFound, CheckpointDiskFull) as exc:
        # Bad settings or inputs found while building the stage, or a full disk: one line,
        # not a traceback.
        print(f"rlfleet-trainer run: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rlfleet-trainer run: interrupted; continue with --resume", file=sys.stderr)
        code = 130
        return 130
    except Exception:
        if info.world_size == 1:
            raise
        traceback.print_exc()
        return 1
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            if code != 0 and info.world_size > 1:
                # A failed rank leaves at once: another rank (or this one's own worker
                # thread) may be inside a collective that would hold
                # destroy_process_group forever (seen on GPUs). torchrun sees the exit
                # and restarts the group, which resumes from the last checkpoint.
                print(
                    f"rlfleet-trainer run: rank {info.rank} failed; leaving the group",
                    file=sys.stderr,
                )
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            dist.destroy_process_group()
    if info.rank != 0:
        return 0
    print(f"trained {state.step} steps; weight version {state.weight_version}")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        # `kill -USR1 <pid>` prints every thread's stack: how a rank stuck in a collective
        # is diagnosed without a debugger on the node.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        sys.exit(run_main(argv[1:]))
    if argv and argv[0] == "eval":
        from rlfleet_trainer.evaluate import eval_main

        sys.exit(eval_main(argv[1:]))
    # Imported here: `run` (every stage and torchrun rank) needs neither the server nor
    # the gRPC face.
    from rlfleet_core.server import service_main

    from rlfleet_trainer.service import SERVICE

    service_main(SERVICE, argv)


if __name__ == "__main__":
    main()
