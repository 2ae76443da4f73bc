"""`rlfleet ui` against real services: a local fleet (reward gateway + rollout on the tiny
model, hf engine) is up, `rlfleet ui` serves its run folder, and headless Chromium loads
the page: every service shows SERVING, the rollout shows the weight version just
published to it (and confirmed by its GetStatus), the reward curve is drawn, and the screenshot (kept as a test artefact:
$RLFLEET_TEST_ARTEFACTS, else pytest's tmp_path) is a PNG that is not blank."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV
from rlfleet_core.client import connect_sync
from rlfleet_core.models import resolve_model
from rlfleet_pipeline.fleet import LocalFleet
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_weights.grpc_stream import iter_weight_chunks
from support import RLFLEET, require_chromium
from transformers import AutoModelForCausalLM

SERVICES = ("reward", "rollout")
VERSION = 2
"""Published to the rollout before the page loads, so the version shown is not a default."""
ARTEFACTS_ENV = "RLFLEET_TEST_ARTEFACTS"


def chromium(binary: str, profile: Path, *args: str) -> str:
    """Run headless Chromium once; its stdout. The virtual-time budget lets the page's
    fetch of /api/snapshot and its rendering finish before the DOM or pixels are taken."""
    done = subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",  # root in CI containers
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            "--window-size=1200,1100",
            "--virtual-time-budget=8000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def serve_ui(run_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`rlfleet ui` on a free port, without the token in its environment: it must read
    the fleet's from <run_dir>/auth_token. Returns its login URL (Chromium follows it to
    the page with the session cookie; libs/cli/tests/test_fleet_ui_auth.py checks the
    refusals)."""
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [RLFLEET, "ui", str(run_dir), "--port", "0", "--interval", "1"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = re.search(
            r"http://127\.0\.0\.1:\d+/login\?key=[\w-]+", log.read_text(errors="replace")
        )
        if found:
            return proc, found.group(0)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"`rlfleet ui` printed no URL:\n{log.read_text(errors='replace')}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ui_page_shows_a_healthy_fleet_in_chromium(tmp_path: Path) -> None:
    binary = require_chromium()
    artefacts = Path(os.environ.get(ARTEFACTS_ENV) or tmp_path)
    artefacts.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    curve = run_dir / "stages" / "rlvr1" / "metrics.jsonl"  # a stage's training log
    curve.parent.mkdir(parents=True)
    rows = [{"step": s, "reward/mean": s / 10, "reward/math": s / 20} for s in range(1, 9)]
    curve.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = {"rollout": ["engine=hf", "model=tiny"]}
    with LocalFleet(SERVICES, run_dir, overrides=overrides, start_timeout_s=300) as fleet:
        weights = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).state_dict()
        header = rollout_pb2.UpdateWeightsRequest(weight_version=VERSION)
        chunks = iter_weight_chunks(header, {k: v.contiguous() for k, v in weights.items()})
        with connect_sync(fleet.target("rollout")) as channel:  # the fleet's token is set
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            assert stub.StreamWeights(chunks, timeout=120).weight_version == VERSION
            status = stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.weight_version == VERSION
        proc, url = serve_ui(run_dir, tmp_path / "ui.log")
        try:
            dom = chromium(binary, tmp_path / "profile", "--dump-dom", url)
            shot = artefacts / "fleet_ui.png"
            shot.unlink(missing_ok=True)
            chromium(binary, tmp_path / "profile", f"--screenshot={shot}", url)
            # Read-only: a write is refused with 405, not the standard library's 501.
            base = url.split("login?")[0]
            post = urllib.request.Request(base + "api/snapshot", data=b"{}", method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(post, timeout=10)
            assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET"
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    print(f"fleet ui screenshot: {shot}")
    assert 'data-loaded="true"' in dom, dom[-3000:]
    assert f"{len(SERVICES)}/{len(SERVICES)} services SERVING" in dom, dom[-3000:]
    for name in SERVICES:
        assert re.search(rf'<tr><td>{name}</td><td class="SERVING">SERVING</td>', dom), dom
    # The rollout table's row: service, then its current weight version.
    assert f"<tr><td>rollout</td><td>{VERSION}</td>" in dom, dom
    assert "<polyline" in dom and "reward/math" in dom and "rlvr1, 8 steps" in dom
    image = Image.open(shot)
    assert image.format == "PNG" and image.size == (1200, 1100)
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20, "the screenshot is blank"
