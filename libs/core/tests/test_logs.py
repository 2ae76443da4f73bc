from __future__ import annotations

import json
import logging

import pytest
from rlfleet_core.logs import JsonFormatter, KeyValueFormatter, request_id_var, setup_logging


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("rlfleet_core.x", logging.INFO, __file__, 1, msg, None, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_key_value_line_carries_request_id_and_extras() -> None:
    token = request_id_var.set("abc123")
    try:
        line = KeyValueFormatter().format(_record("rpc done", method="/x.Y/Z", ms=1.5))
    finally:
        request_id_var.reset(token)
    assert "level=info" in line
    assert "request_id=abc123" in line
    assert "method=/x.Y/Z" in line and "ms=1.5" in line
    assert 'msg="rpc done"' in line


def test_json_format_is_one_object_per_line() -> None:
    data = json.loads(JsonFormatter().format(_record("hello", port=5)))
    assert data["msg"] == "hello" and data["port"] == 5 and data["level"] == "info"


def test_third_party_loggers_are_quiet_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("test")
    logging.getLogger("some.library").info("noise")
    logging.getLogger("rlfleet_core.test").info("ours")
    err = capsys.readouterr().err
    assert "noise" not in err
    assert "msg=ours" in err and "service=test" in err
