"""`rlfleet-reward`: run the reward service (same flags as `rlfleet serve reward`), or
`rlfleet-reward score --env E --response TEXT [--field k=v ...]` to score one response in
this process (prints JSON; `rlfleet reward score` runs this)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rlfleet_core.server import service_main

from rlfleet_reward.service import SERVICE


def score_main(argv: Sequence[str]) -> int:
    from rlfleet_reward.cli import ScoreCommandError, score_command

    parser = argparse.ArgumentParser(
        prog="rlfleet-reward score", description="Score one response with a reward environment."
    )
    parser.add_argument("--env", required=True, help="environment, e.g. math, mcqa, code")
    parser.add_argument("--response", required=True, help="the model's response text")
    parser.add_argument("--field", action="append", default=[], help="row field key=value")
    parser.add_argument("--num-tokens", type=int, default=0, help="generated tokens")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="verification deadline")
    parser.add_argument("--sandbox", help="sandbox gRPC address for `code`")
    args = parser.parse_args(argv)
    try:
        result = score_command(
            args.env,
            args.response,
            args.field,
            num_tokens=args.num_tokens,
            timeout_s=args.timeout_s,
            sandbox_target=args.sandbox,
        )
    except ScoreCommandError as exc:
        print(f"rlfleet-reward: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


def main() -> None:
    if sys.argv[1:2] == ["score"]:
        sys.exit(score_main(sys.argv[2:]))
    service_main(SERVICE)


if __name__ == "__main__":
    main()
