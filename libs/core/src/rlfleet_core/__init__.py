"""rlfleet-core: what every rlfleet service and the CLI share."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlfleet-core")
except PackageNotFoundError:  # imported from a source tree (e.g. a GPU box's PYTHONPATH)
    __version__ = "0+source"
