"""Structured, quiet-by-default logging for every rlfleet process.

One line per event, `key=value` pairs (or JSON with RLFLEET_LOG_FORMAT=json), each line
carrying the service name and, inside an RPC, its request id. Third-party loggers are
held at WARNING so a healthy service prints its start line and little else.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from typing import Any

# Set by the server interceptor for the duration of one RPC.
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

_service_name = ""
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
    }
    if _service_name:
        fields["service"] = _service_name
    rid = request_id_var.get()
    if rid:
        fields["request_id"] = rid
    fields["msg"] = record.getMessage()
    # Extra structured fields: logger.info("...", extra={"port": 50051}).
    for key, value in vars(record).items():
        if key not in _RESERVED and not key.startswith("_"):
            fields[key] = value
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = []
        for key, value in _fields(record).items():
            text = str(value)
            if key == "exc" or " " in text or "=" in text or not text:
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


# Top-level packages of ours; their loggers follow `level`, everyone else's stay at WARNING.
OUR_PACKAGES = (
    "rlfleet_core",
    "rlfleet_cli",
    "rlfleet_trainer",
    "rlfleet_rollout",
    "rlfleet_reward",
    "rlfleet_sandbox",
    "rlfleet_swe",
    "rlfleet_weights",  # the weight transports (where a weight group formed, retries)
)


def setup_logging(service: str = "", level: str | None = None, fmt: str | None = None) -> None:
    """Configure logging once per process; modules use `logging.getLogger(__name__)`.

    level: for rlfleet's own loggers (default INFO, or RLFLEET_LOG_LEVEL).
    fmt: "kv" (default) or "json" (or RLFLEET_LOG_FORMAT).
    """
    global _service_name
    _service_name = service
    level = (level or os.environ.get("RLFLEET_LOG_LEVEL") or "INFO").upper()
    fmt = (fmt or os.environ.get("RLFLEET_LOG_FORMAT") or "kv").lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for package in OUR_PACKAGES:
        logging.getLogger(package).setLevel(level)
