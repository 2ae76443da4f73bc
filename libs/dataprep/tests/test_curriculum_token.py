"""Where the curriculum pass sends the fleet token: to a loopback `--rollout-url`, to
another host only with `--rollout-send-token`, and never along a redirect.

It used to send the token to whatever `--rollout-url` named, and urllib followed a
redirect with the `authorization` header to wherever it pointed. The servers here are
real HTTP servers on this machine that record the headers they receive; a host name
(this machine's own, resolving here) stands for a host beyond loopback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rlfleet_contracts.rows import DataError
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV
from rlfleet_dataprep.curriculum import ChatSampler, CurriculumOptions, rollout_token

RLFLEET = str(Path(sys.executable).parent / "rlfleet")
TOKEN = "curriculum-test-token-0123456789abcdef"
MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model"}]}


class Recorder:
    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        self.redirect_to: str | None = None


@contextmanager
def server(host: str = "127.0.0.1") -> Iterator[tuple[str, Recorder]]:
    """An OpenAI-ish server on `host`: records each request's `authorization`; answers
    /v1/models (401 without the token), or redirects when `redirect_to` is set."""
    seen = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.authorizations.append(self.headers.get("authorization"))
            if seen.redirect_to:
                self.send_response(307)
                self.send_header("Location", seen.redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            ok = self.headers.get("authorization") == f"Bearer {TOKEN}"
            body = json.dumps(MODELS if ok else {"detail": "missing token"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{host}:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def own_host_name() -> tuple[str, str]:
    """(this machine's host name, the address it resolves to): a name is never taken
    for loopback, whatever it resolves to."""
    name = socket.gethostname()
    try:
        return name, socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"the host name {name} does not resolve here")


def prep(tmp_path: Path, rollout_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """`rlfleet data prep rl` with the curriculum pass against `rollout_url` and the fleet
    token in the environment (the reward address is closed: the pass stops at the
    rollout's /v1/models, which is all these tests look at)."""
    blend = tmp_path / "b.jsonl"
    row = {
        "id": "x",
        "env": "instruction_following",
        "responses_create_params": {"input": "Say something."},
        "instruction_id_list": ["punctuation:no_comma"],
        "kwargs": [{}],
    }
    blend.write_text(json.dumps(row) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    env[TOKEN_ENV] = TOKEN
    args = ["--out", str(tmp_path / "d"), "--val-rows", "0", "--curriculum-samples", "2"]
    args += ["--rollout-url", rollout_url, "--reward", "127.0.0.1:9", *flags]
    return subprocess.run(
        [RLFLEET, "data", "prep", "rl", str(blend), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_token_does_not_go_beyond_loopback_unless_asked(tmp_path: Path) -> None:
    name, address = own_host_name()
    with server(address) as (where, seen):
        port = where.rsplit(":", 1)[1]
        done = prep(tmp_path, f"http://{name}:{port}")
    assert done.returncode == 2, done.stderr
    assert seen.authorizations == [None]
    assert "HTTP 401" in done.stderr and "--rollout-send-token" in done.stderr
    assert TOKEN not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_redirects_are_not_followed(tmp_path: Path) -> None:
    with server() as (final, final_seen), server() as (first, first_seen):
        first_seen.redirect_to = f"http://{final}"
        done = prep(tmp_path, f"http://{first}")
    assert done.returncode == 2, done.stderr
    assert first_seen.authorizations == [f"Bearer {TOKEN}"]  # loopback: sent
    assert final_seen.authorizations == []  # the redirect's target heard nothing
    assert f"redirects to http://{final}/v1/models" in done.stderr
    assert "Traceback" not in done.stderr


def test_loopback_gets_the_token_and_another_host_only_on_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    options = CurriculumOptions(samples=2, timeout_s=30)
    with server() as (where, seen):
        url = f"http://{where}"
        assert ChatSampler(url, options, rollout_token(url)).model == "tiny"
    assert seen.authorizations == [f"Bearer {TOKEN}"]
    name, address = own_host_name()
    with server(address) as (where, seen):
        url = f"http://{name}:{where.rsplit(':', 1)[1]}"
        assert rollout_token(url) is None
        assert ChatSampler(url, options, rollout_token(url, True)).model == "tiny"
    assert seen.authorizations == [f"Bearer {TOKEN}"]
    assert rollout_token("http://10.0.0.5:8000") is None
    assert rollout_token("http://[::1]:8000") == TOKEN
    with pytest.raises(DataError, match="--rollout-url: expected http"):
        rollout_token("file:///etc/passwd")
