"""`python -m rlfleet_core.healthcheck HOST:PORT [SERVICE]`: exit 0 when the standard gRPC
health check answers SERVING, 1 otherwise. Used by container HEALTHCHECKs and compose."""

from __future__ import annotations

import sys

import grpc

from rlfleet_core.client import check_health


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m rlfleet_core.healthcheck HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    try:
        status = check_health(args[0], args[1] if len(args) == 2 else "", timeout_s=3.0)
    except grpc.RpcError as exc:
        status = exc.code().name
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
