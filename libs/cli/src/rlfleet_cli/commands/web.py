"""`rlfleet ui [RUN_DIR]`: the fleet view as a small web page served by the CLI.

`/` is one self-contained HTML page (rlfleet_cli/fleet_page.html: no CDN, nothing is
fetched from outside the machine) that polls `/api/snapshot` (the `rlfleet status --json`
object) and draws the tables and the reward curve (inline SVG). Served by the standard
library's threading HTTP server: no new dependency for one page and one JSON route.

The page shows what the fleet's token protects (addresses, traffic, failures), so it is
a face like any service's and is never open (docs/security.md, "rlfleet ui"):
- every request needs a credential: the session cookie that the printed login URL
  (`/login?key=<a fresh secret of this process>`, never the fleet token) sets, HttpOnly
  and SameSite=Strict, or the fleet's own token as `authorization: Bearer` (scripts);
- a request whose `Host` is not an address this server was bound to (or a loopback name)
  is refused with 421, so a DNS-rebinding page cannot reach it under its own name;
- no CORS header, no framing, no referrer, and a CSP that allows only the page's own
  script and style (by hash) and requests to itself.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import secrets
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

import typer

from rlfleet_cli.commands.status import RunDir
from rlfleet_cli.ui import err, fail, out

DEFAULT_PORT = 8270
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def page_and_csp(interval_ms: int) -> tuple[bytes, str]:
    """The page and a Content-Security-Policy that allows exactly its inline script and
    style (pinned by hash) and fetches from this server only."""
    page = files("rlfleet_cli").joinpath("fleet_page.html").read_text()
    page = page.replace("__INTERVAL_MS__", str(interval_ms))
    (script,) = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    (style,) = re.findall(r"<style>(.*?)</style>", page, flags=re.S)
    csp = (
        f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return page.encode(), csp


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The `Host` header values this server answers: loopback names, the bound address,
    and, bound to every interface, this machine's own names and addresses."""
    names = {*LOOPBACK_NAMES, host.lower() if ":" not in host else f"[{host.strip('[]')}]"}
    if host in WILDCARDS:
        own = {socket.gethostname(), socket.getfqdn()}
        for name in list(own):
            with contextlib.suppress(OSError):  # a name that does not resolve
                own.update(socket.gethostbyname_ex(name)[2])
        names |= {n.lower() for n in own if n}
    with_port = {f"{n}:{port}" for n in names}
    return frozenset(with_port | (names if port == 80 else set()))


class FleetUI:
    """What the handler needs: the page, the snapshot source and the credentials."""

    def __init__(
        self,
        snapshot: Callable[[], tuple[object, int]],
        interval_ms: int,
        fleet_token: str | None,
    ) -> None:
        self.snapshot = snapshot
        self.page, self.csp = page_and_csp(interval_ms)
        self.fleet_token = fleet_token
        self.login_key = secrets.token_urlsafe(32)
        """In the printed login URL; grants this page only, for this process's life."""
        self.session = secrets.token_urlsafe(32)
        """The cookie's value: another secret, so the key never sits in a cookie jar."""
        self.cookie = "rlfleet_ui"
        self.hosts: frozenset[str] = frozenset()

    def bind(self, host: str, port: int) -> None:
        self.cookie = f"rlfleet_ui_{port}"  # one per port: cookies ignore ports
        self.hosts = allowed_hosts(host, port)

    def authenticated(self, headers: dict[str, str]) -> bool:
        presented = headers.get("authorization", "")
        scheme, _, value = presented.partition(" ")
        if self.fleet_token and scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip().encode(), self.fleet_token.encode())
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie and hmac.compare_digest(value.encode(), self.session.encode()):
                return True
        return False

    def handler(self) -> type[BaseHTTPRequestHandler]:
        ui = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10.0  # a client that never sends its request does not hold a thread

            def do_GET(self) -> None:
                host = (self.headers.get("host") or "").strip().lower()
                if host not in ui.hosts:
                    # DNS rebinding: a page of evil.example resolved to this machine
                    # arrives with its own name as Host.
                    self._send(
                        421,
                        "text/plain; charset=utf-8",
                        f"Host {host or '(none)'!r} is not this server's address; open "
                        "the URL `rlfleet ui` printed\n".encode(),
                    )
                    return
                url = urlsplit(self.path)
                if url.path == "/login":
                    self._login(parse_qs(url.query).get("key", [""])[0])
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                if not ui.authenticated(headers):
                    message = (
                        "not logged in: open the login URL `rlfleet ui` printed (or send "
                        "`authorization: Bearer <fleet token>`)"
                    )
                    if url.path == "/api/snapshot":
                        refusal = json.dumps({"error": message}).encode()
                        self._send(401, "application/json", refusal)
                    else:
                        self._send(401, "text/plain; charset=utf-8", (message + "\n").encode())
                    return
                if url.path == "/":
                    self._send(200, "text/html; charset=utf-8", ui.page, csp=True)
                elif url.path == "/api/snapshot":
                    snapshot, code = ui.snapshot()
                    self._send(code, "application/json", json.dumps(snapshot).encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _login(self, key: str) -> None:
                if not hmac.compare_digest(key.encode(), ui.login_key.encode()):
                    self._send(401, "text/plain", b"wrong or missing login key\n")
                    return
                self.send_response(303)  # to `/`: the key leaves the address bar
                self.send_header("Location", "/")
                self.send_header(
                    "Set-Cookie",
                    f"{ui.cookie}={ui.session}; HttpOnly; SameSite=Strict; Path=/",
                )
                self._common_headers()
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _read_only(self) -> None:  # the standard library would answer 501
                self.send_response(405)
                self.send_header("Allow", "GET")
                self._common_headers()
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _read_only

            def _common_headers(self) -> None:
                self.send_header("Cache-Control", "no-store")
                self.send_header("Referrer-Policy", "no-referrer")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("X-Frame-Options", "DENY")

            def _send(self, code: int, kind: str, body: bytes, csp: bool = False) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self._common_headers()
                if csp:
                    self.send_header("Content-Security-Policy", ui.csp)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # one line per poll would drown the URL

        return Handler


def serve(ui_state: FleetUI, host: str, port: int) -> ThreadingHTTPServer:
    """The bound server (not yet serving); raises OSError when the port is taken."""
    server = ThreadingHTTPServer((host, port), ui_state.handler())
    ui_state.bind(host, server.server_address[1])
    return server


def login_url(host: str, port: int, key: str) -> str:
    shown = "127.0.0.1" if host in WILDCARDS else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/login?key={key}"


def ui(
    run_dir: RunDir = Path("runs/up"),
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind. Loopback by default. Beyond loopback the page still "
            "needs the login key or the fleet token, but travels in clear text (no TLS)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0 = a free one).")] = DEFAULT_PORT,
    interval: Annotated[
        float, typer.Option(help="Seconds between the page's refreshes.", min=0.5)
    ] = 2.0,
) -> None:
    """Serve a live web view of a running fleet until Ctrl-C: service health, rollout
    weight versions, queues, rates, trainer lag, reward per environment and the reward
    curve of the newest stage. Prints the login URL to open (its key is this process's,
    not the fleet token); /api/snapshot is the JSON behind it."""
    from rlfleet_core.auth import is_loopback
    from rlfleet_pipeline.fleet_view import FleetView, NoServices, fleet_token

    view = FleetView(run_dir)
    try:
        view.snapshot()  # fail now, in the terminal, if the folder has no fleet
    except NoServices as exc:
        raise fail(str(exc)) from None
    lock = threading.Lock()  # FleetView keeps counters between snapshots: one at a time

    def snapshot() -> tuple[object, int]:
        try:
            with lock:
                return view.snapshot().to_json(), 200
        except NoServices as exc:
            return {"error": str(exc)}, 503

    state = FleetUI(snapshot, int(interval * 1000), fleet_token(run_dir))
    try:
        server = serve(state, host, port)
    except OSError as exc:
        raise fail(f"cannot bind {host}:{port}: {exc.strerror}; try --port 0") from None
    if not is_loopback(host):
        err.print(
            f"[yellow]rlfleet ui: serving on {host}, beyond this machine, without TLS: the "
            "login key and the page cross the network in clear text[/]"
        )
    bound_port = server.server_address[1]
    out.print(
        f"rlfleet ui: {login_url(host, bound_port, state.login_key)} (Ctrl-C to stop)",
        soft_wrap=True,
        markup=False,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
