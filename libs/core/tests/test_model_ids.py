"""Model references beyond the bundled names: a local folder and a Hugging Face id taken
from a Hugging Face cache laid out in tmp, offline. No network: every resolution of an id
runs in a child process with HF_HUB_OFFLINE=1 and HF_HUB_CACHE in tmp (huggingface_hub
reads both when it is imported, as a real service does at start)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from huggingface_hub import scan_cache_dir
from huggingface_hub.file_download import repo_folder_name
from rlfleet_core.models import (
    ModelNotFound,
    build_tiny_model,
    model_reference_problem,
    resolve_model,
)

REPO_ID = "rlfleet-test/tiny-qwen2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_model(out)
    return out


def _fill_hub_cache(cache: Path, repo_id: str, model: Path) -> Path:
    """`model`'s files as huggingface_hub stores a download: blobs named by hash,
    snapshots/<commit>/ of symlinks to them, refs/main naming the commit."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in model.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def _resolve_offline(ref: str, cache: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "from rlfleet_core.models import ModelNotFound, resolve_model\n"
        "try:\n"
        "    print(resolve_model(sys.argv[1]))\n"
        "except ModelNotFound as exc:\n"
        "    print(exc, file=sys.stderr)\n"
        "    sys.exit(3)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", code, ref], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_local_folder_resolves_to_itself(tiny_folder: Path, tmp_path: Path) -> None:
    assert resolve_model(tiny_folder) == tiny_folder.resolve()
    assert model_reference_problem(str(tiny_folder)) is None
    with pytest.raises(ModelNotFound, match="no such folder"):
        resolve_model(str(tmp_path / "not-written"))


def test_a_hub_id_loads_from_the_cache_offline(tiny_folder: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path / "hub"
    snapshot = _fill_hub_cache(cache, REPO_ID, tiny_folder)
    # huggingface_hub itself sees a complete cached repo at that revision.
    (repo,) = scan_cache_dir(cache).repos
    assert (repo.repo_id, [r.commit_hash for r in repo.revisions]) == (REPO_ID, [COMMIT])

    result = _resolve_offline(REPO_ID, cache)
    assert result.returncode == 0, result.stderr
    folder = Path(result.stdout.strip())
    assert folder == snapshot.resolve() or folder == snapshot
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.num_hidden_layers == 2
    text = "What is 12 + 30?"
    ids = AutoTokenizer.from_pretrained(folder).encode(text)
    assert ids == AutoTokenizer.from_pretrained(tiny_folder).encode(text)


def test_an_id_not_in_the_cache_offline_is_one_line_saying_how_to_fix(tmp_path: Path) -> None:
    cache = tmp_path / "empty-hub"
    cache.mkdir()
    result = _resolve_offline("HuggingFaceTB/SmolLM2-135M-Instruct", cache)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert "'HuggingFaceTB/SmolLM2-135M-Instruct': not in the Hugging Face cache" in line
    assert f"({cache})" in line
    assert "`hf download HuggingFaceTB/SmolLM2-135M-Instruct`" in line
    assert "pass its path" in line


@pytest.mark.parametrize(
    ("ref", "ok"),
    [
        ("tiny", True),
        ("smollm2-135m-instruct", True),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
        ("gpt2", True),
        ("/abs/folder/written/later", True),
        ("./rel/folder", True),
        ("runs/tiny/stages/rlvr1/hf", True),
        ("not an id", False),
        ("org/name--bad", False),
        ("", False),
    ],
)
def test_the_form_of_a_reference_is_checked(ref: str, ok: bool) -> None:
    problem = model_reference_problem(ref)
    assert (problem is None) == ok, problem
    if not ok:
        assert problem is not None and "(smollm2-135m-instruct, tiny, tiny-nemotron-h)" in problem
        with pytest.raises(ModelNotFound, match="Hugging Face id"):
            resolve_model(ref)


def test_download_false_never_reaches_the_hub(tmp_path: Path) -> None:
    """What the trainer uses to compare a served name with its policy: cache only, even
    without HF_HUB_OFFLINE (no network is touched: huggingface_hub is told local only)."""
    code = (
        "import sys\n"
        "from rlfleet_core.models import ModelNotFound, resolve_model\n"
        "try:\n"
        "    resolve_model('some-org/served-name', download=False)\n"
        "except ModelNotFound as exc:\n"
        "    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_HUB_CACHE"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert "'some-org/served-name': not in the Hugging Face cache" in result.stdout, result.stderr


def test_hub_requests_get_deadlines(tmp_path: Path) -> None:
    """huggingface_hub's client has no timeout of its own; resolving an id gives it one."""
    code = (
        "from huggingface_hub.utils import get_session\n"
        "from rlfleet_core.models import ModelNotFound, resolve_model\n"
        "print(get_session().timeout.read)\n"
        "try:\n"
        "    resolve_model('some-org/some-model')\n"
        "except ModelNotFound:\n"
        "    pass\n"
        "t = get_session().timeout\n"
        "print(t.connect, t.read)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.stdout.split() == ["None", "10.0", "60.0"], result.stderr
