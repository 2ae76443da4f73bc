"""Serve one NeMo-Gym resources server over real HTTP, for the side-by-side benchmark.

Runs in the side environment (see `side_env.sh`), never in rlfleet's:

    PYTHONPATH=<unpacked nemo-gym wheel> <side python> serve_reference.py SERVER PORT

The server is built as `reference.py` builds it (its own config and verify code, no judge),
and its own `setup_webserver()` FastAPI app is served by uvicorn with httptools and one
process, as NeMo-Gym's `run_webserver` serves a server with the default `num_workers`.
"""

from __future__ import annotations

import logging
import sys

import uvicorn
from reference import SERVERS, build  # this script's folder is on sys.path


def main() -> None:
    server, port = sys.argv[1], int(sys.argv[2])
    if server not in SERVERS:
        raise SystemExit(f"unknown server {server!r}; one of {', '.join(SERVERS)}")
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    instance, _ = build(server)
    uvicorn.run(
        instance.setup_webserver(),
        host="127.0.0.1",
        port=port,
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
