"""rlfleet swe-runner service."""

from importlib.metadata import version

__version__ = version("rlfleet-swe")
