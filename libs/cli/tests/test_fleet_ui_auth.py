"""`rlfleet ui` is a face like any service's: a real `rlfleet ui` process on a folder
whose fleet has stopped (the page and its JSON still serve), asked over loopback HTTP.

It used to answer anyone who reached the port, with any `Host` (a DNS-rebinding page
could read the fleet's addresses and figures through the victim's browser). Now: the
printed login URL sets an HttpOnly SameSite=Strict cookie, the fleet token works as a
bearer, everything else is 401; a foreign `Host` is 421; no CORS header; the page has a
CSP that allows only its own script and style.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV

RLFLEET = str(Path(sys.executable).parent / "rlfleet")
FLEET_TOKEN = "fleet-token-for-the-ui-test-0123456789"
GONE_PID = 2**22 + 4321  # above Linux's pid_max: no such process


@pytest.fixture
def login(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """(port, login path with its key) of `rlfleet ui` on a stopped fleet's folder."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rollout.ports.json").write_text(
        json.dumps({"grpc": 1, "http": None, "pid": GONE_PID})
    )
    (tmp_path / "auth_token").write_text(FLEET_TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    log = tmp_path / "ui.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [RLFLEET, "ui", str(tmp_path), "--port", "0"], stdout=sink, stderr=sink, env=env
        )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"http://127\.0\.0\.1:(\d+)(/login\?key=[\w-]+)", log.read_text())
            if found:
                yield int(found.group(1)), found.group(2)
                assert FLEET_TOKEN not in log.read_text()  # the URL's key is not the token
                return
            time.sleep(0.2)
        pytest.fail(f"`rlfleet ui` printed no login URL:\n{log.read_text()}")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=headers)
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


def test_the_ui_needs_the_login_key_or_the_fleet_token(login: tuple[int, str]) -> None:
    port, path = login
    for route in ("/", "/api/snapshot", "/nope"):
        code, headers, body = get(port, route)
        assert code == 401, (route, body)
        assert b"login URL" in body and "access-control-allow-origin" not in headers
    assert get(port, "/login?key=wrong")[0] == 401
    assert get(port, "/api/snapshot", authorization="Bearer not-the-token-at-all")[0] == 401

    code, headers, _ = get(port, path)
    assert code == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    session = cookie.split(";")[0]
    assert path.split("key=")[1] not in session  # the cookie is not the login key

    code, headers, page = get(port, "/", cookie=session)
    assert code == 200 and b"rlfleet fleet view" in page
    csp = headers["content-security-policy"]
    assert csp.startswith("default-src 'none'; script-src 'sha256-") and "unsafe" not in csp
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    assert "access-control-allow-origin" not in headers
    code, _, body = get(port, "/api/snapshot", cookie=session)
    assert code == 200 and "services" in json.loads(body)
    code, _, body = get(port, "/api/snapshot", authorization=f"Bearer {FLEET_TOKEN}")
    assert code == 200 and "services" in json.loads(body)


def test_a_foreign_host_header_is_refused(login: tuple[int, str]) -> None:
    """DNS rebinding: evil.example resolved to 127.0.0.1 sends `Host: evil.example`."""
    port, path = login
    session = get(port, path)[1]["set-cookie"].split(";")[0]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}"):
        code, _, body = get(port, "/api/snapshot", cookie=session, host=host)
        assert code == 421 and b"not this server's address" in body, host
        assert get(port, path, host=host)[0] == 421  # nor can it log in
    assert get(port, "/api/snapshot", cookie=session, host=f"localhost:{port}")[0] == 200
