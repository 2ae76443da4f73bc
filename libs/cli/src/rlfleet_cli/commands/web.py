"""`rlfleet ui [RUN_DIR]`: the fleet view as a small web page served by the CLI.

`/` is one self-contained HTML page (rlfleet_cli/fleet_page.html: no CDN, nothing is
fetched from outside the machine) that polls `/api/snapshot` (the `rlfleet status --json`
object) and draws the tables and the reward curve (inline SVG). Served by the standard
library's threading HTTP server: no new dependency for one page and one JSON route.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Annotated

import typer

from rlfleet_cli.commands.status import RunDir
from rlfleet_cli.ui import err, fail, out

DEFAULT_PORT = 8270


def ui(
    run_dir: RunDir = Path("runs/up"),
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind. Loopback by default: the page shows the fleet's "
            "addresses and figures to anyone who can reach it (it never shows the token)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0 = a free one).")] = DEFAULT_PORT,
    interval: Annotated[
        float, typer.Option(help="Seconds between the page's refreshes.", min=0.5)
    ] = 2.0,
) -> None:
    """Serve a live web view of a running fleet until Ctrl-C: service health, rollout
    weight versions, queues, rates, trainer lag, reward per environment and the reward
    curve of the newest stage. Prints the URL to open; /api/snapshot is the JSON behind it."""
    from rlfleet_core.auth import is_loopback
    from rlfleet_pipeline.fleet_view import FleetView, NoServices

    view = FleetView(run_dir)
    try:
        view.snapshot()  # fail now, in the terminal, if the folder has no fleet
    except NoServices as exc:
        raise fail(str(exc)) from None
    page = files("rlfleet_cli").joinpath("fleet_page.html").read_text()
    page = page.replace("__INTERVAL_MS__", str(int(interval * 1000)))
    lock = threading.Lock()  # FleetView keeps counters between snapshots: one at a time

    class Handler(BaseHTTPRequestHandler):
        timeout = 10.0  # a client that never sends its request does not hold a thread

        def do_GET(self) -> None:
            if self.path == "/":
                self._send(200, "text/html; charset=utf-8", page.encode())
            elif self.path == "/api/snapshot":
                try:
                    with lock:
                        body, code = view.snapshot().to_json(), 200
                except NoServices as exc:
                    body, code = {"error": str(exc)}, 503
                self._send(code, "application/json", json.dumps(body).encode())
            else:
                self._send(404, "text/plain", b"not found\n")

        def _read_only(self) -> None:  # the standard library would answer 501
            self.send_response(405)
            self.send_header("Allow", "GET")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per poll would drown the URL

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise fail(f"cannot bind {host}:{port}: {exc.strerror}; try --port 0") from None
    if not is_loopback(host):
        err.print(f"[yellow]rlfleet ui: serving on {host}, beyond this machine[/]")
    bound_port = server.server_address[1]
    out.print(f"rlfleet ui: http://{host}:{bound_port}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
