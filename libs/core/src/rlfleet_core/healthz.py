"""`python -m rlfleet_core.healthz [URL]`: exit 0 when a service's HTTP face answers
/healthz with 200 SERVING, 1 otherwise (printing what it answered). The container health
probe (compose.yaml, the images' HEALTHCHECK): Docker runs it every few seconds for every
container, so it imports nothing but the standard library (~0.1 CPU s a probe; the gRPC
probe, `rlfleet_core.healthcheck`, costs ~0.3 s for grpc's import: 6 % of a core per
container at a 5 s interval). /healthz reads the same health state as the gRPC health
service (rlfleet_core.health) and needs no token."""

from __future__ import annotations

import http.client
import sys
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:8000/healthz"
TIMEOUT_S = 3.0


def probe(url: str = DEFAULT_URL, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """(serving, what the service said or why it could not be asked)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False, f"not an http(s) URL: {url!r}"
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=timeout_s)
    try:
        connection.request("GET", parts.path or "/healthz")
        response = connection.getresponse()
        text = response.read(4096).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, timed out
        return False, f"cannot reach {url}: {exc}"
    finally:
        connection.close()
    # 503 "NOT_SERVING: <reason>" while starting, draining or unable to serve
    return response.status == 200 and text.startswith("SERVING"), f"{response.status} {text}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: python -m rlfleet_core.healthz [URL]", file=sys.stderr)
        return 2
    serving, text = probe(args[0] if args else DEFAULT_URL)
    print(text)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
