"""rlfleet-core: what every rlfleet service and the CLI share."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Looked up on first use: reading the installed distributions costs ~0.1 s, which
    # every process importing any rlfleet_core module (a container's health probe every
    # few seconds among them) would otherwise pay.
    if name != "__version__":
        raise AttributeError(f"module 'rlfleet_core' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlfleet-core")
    except PackageNotFoundError:  # imported from a source tree (e.g. a GPU box's PYTHONPATH)
        return "0+source"
