"""The `rlfleet` command."""

from importlib.metadata import version

__version__ = version("rlfleet")
