"""Hugging Face model ids: their form (checked when a config loads) and their folder in
the Hugging Face cache (downloaded there first when the Hub can be reached).

Only huggingface_hub's own APIs touch the cache (`snapshot_download`, which also honours
HF_HUB_OFFLINE, HF_HUB_CACHE and HF_HOME, and `constants.HF_HUB_CACHE` for messages).
huggingface_hub comes with transformers (`rlfleet-core[models]`); where it is not
installed (a reward or sandbox process), an id's form is not checked here and the process
that loads the model reports the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# What a model folder needs: config, weights in safetensors, tokenizer and templates.
# PyTorch .bin, ONNX, GGUF and TF/Flax copies that many repos also hold are skipped.
MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


HUB_CONNECT_TIMEOUT_S = 10.0
HUB_READ_TIMEOUT_S = 60.0
"""Deadlines of every Hub request of this process: huggingface_hub's own client has none
(`timeout=None`), so a stalled connection would hang a service's start for ever. The read
deadline bounds each wait for bytes, not a whole download."""


class ModelNotFound(ValueError):
    """A model reference that is neither a local model folder, a bundled name, nor a
    Hugging Face id in the cache or downloadable now (re-exported by rlfleet_core.models)."""


def looks_like_path(text: str) -> bool:
    """A local path rather than a Hub id: absolute, relative with ./ or ../, home-relative,
    or with more than one `/` (a Hub id is `name` or `namespace/name`)."""
    return text.startswith(("/", ".", "~")) or text.count("/") > 1


def hub_id_problem(text: str) -> str | None:
    """Why `text` cannot be a Hugging Face model id, or None when it can (or when
    huggingface_hub is not installed to tell)."""
    try:
        from huggingface_hub.errors import HFValidationError

        # Exported lazily by huggingface_hub.utils, which mypy cannot see.
        from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return None
    try:
        validate_repo_id(text)
    except HFValidationError as exc:
        return str(exc).splitlines()[0]
    return None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache of this process (HF_HUB_CACHE, else HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def set_hub_deadlines() -> None:
    """Give huggingface_hub's HTTP client (this process's, shared by transformers) a
    connect and a read deadline. Its default client factory is not public; where it is
    missing (another huggingface_hub version) the client is left as it is."""
    import huggingface_hub
    from huggingface_hub.utils import _http

    base = getattr(_http, "default_client_factory", None)
    if base is None:
        return

    def client_with_deadlines() -> Any:
        client = base()
        client.timeout = type(client.timeout)(HUB_READ_TIMEOUT_S, connect=HUB_CONNECT_TIMEOUT_S)
        return client

    huggingface_hub.set_client_factory(client_with_deadlines)


def resolve_hub_model(repo_id: str, *, download: bool = True) -> Path:
    """The snapshot folder of `repo_id` in the Hugging Face cache, downloading the model's
    files first unless the Hub is unreachable, HF_HUB_OFFLINE=1 or not `download` (then
    the cache only).

    Every Hub request has a deadline (set_hub_deadlines). Raises ModelNotFound, one line
    saying how to get the model here, when it is not cached and cannot be fetched.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if download:
        set_hub_deadlines()
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                allow_patterns=list(MODEL_FILE_PATTERNS),
                local_files_only=not download,
            )
        )
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as exc:
        kind = (
            "gated (log in with `hf auth login`)"
            if isinstance(exc, GatedRepoError)
            else ("not found on the Hugging Face Hub (or private: log in with `hf auth login`)")
        )
        raise ModelNotFound(f"model {repo_id!r}: {kind}") from None
    except LocalEntryNotFoundError:
        raise ModelNotFound(
            f"model {repo_id!r}: not in the Hugging Face cache ({hub_cache_dir()}) and the Hub "
            f"cannot be reached (offline or no network); on a machine with network run "
            f"`hf download {repo_id}` (huggingface-cli download on older huggingface_hub) and "
            f"copy its cache here (HF_HUB_CACHE), or copy the model folder and pass its path"
        ) from None
    if not (folder / "config.json").is_file():
        raise ModelNotFound(
            f"model {repo_id!r}: its snapshot {folder} has no config.json (not a transformers "
            "model, or an incomplete download: run `hf download` for it again)"
        )
    return folder
