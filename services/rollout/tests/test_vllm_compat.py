"""The vllm engine's version gate: the tested range starts, anything else is refused
with an error naming the range (or starts under the documented override)."""

from __future__ import annotations

import importlib.util

import pytest
from rlfleet_core.errors import FailedPrecondition
from rlfleet_rollout.engines.vllm_compat import ALLOW_ENV, check_version, parse_version


@pytest.mark.parametrize(
    ("text", "want"),
    [("0.24.0", (0, 24)), ("0.32.0+cpu", (0, 32)), ("0.28.1", (0, 28)), ("0.33.0rc1", (0, 33))],
)
def test_parse_version(text: str, want: tuple[int, int]) -> None:
    assert parse_version(text) == want


@pytest.mark.parametrize("text", ["0.24.0", "0.30.2", "0.32.0", "0.32.1+cpu"])
def test_tested_range_starts(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    assert check_version(text) == parse_version(text)


@pytest.mark.parametrize("text", ["0.23.1", "0.33.0", "1.0.0"])
def test_outside_the_range_is_refused_naming_it(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(FailedPrecondition) as info:
        check_version(text)
    assert text in str(info.value) and "0.24 to 0.32" in str(info.value)
    assert ALLOW_ENV in str(info.value)
    monkeypatch.setenv(ALLOW_ENV, "1")
    assert check_version(text) == parse_version(text)


def test_garbage_version_is_a_clear_error() -> None:
    with pytest.raises(FailedPrecondition, match="cannot read the vLLM version"):
        check_version("dev")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_installed_vllm_is_in_range(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    monkeypatch.delenv(ALLOW_ENV, raising=False)
    check_version(vllm.__version__)


def test_direct_load_only_for_unquantized_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """`model.load_weights` on CUDA unquantized models; `reload_weights` elsewhere (the
    CPU backend repacks weights after loading; quantized models process them)."""
    from types import SimpleNamespace

    import torch
    from rlfleet_rollout.engines.vllm_worker import _direct_load

    def worker(device: str, quantization: str | None) -> SimpleNamespace:
        config = SimpleNamespace(quantization=quantization)
        return SimpleNamespace(
            device=torch.device(device), model_runner=SimpleNamespace(model_config=config)
        )

    monkeypatch.delenv("RLFLEET_VLLM_RELOAD", raising=False)
    assert _direct_load(worker("cuda", None))
    assert not _direct_load(worker("cpu", None))
    assert not _direct_load(worker("cuda", "fp8"))
    monkeypatch.setenv("RLFLEET_VLLM_RELOAD", "1")
    assert not _direct_load(worker("cuda", None))
