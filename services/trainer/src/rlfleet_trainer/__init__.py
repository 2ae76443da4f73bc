"""rlfleet trainer service."""

from importlib.metadata import version

__version__ = version("rlfleet-trainer")
