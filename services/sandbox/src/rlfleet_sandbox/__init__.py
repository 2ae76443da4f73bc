"""rlfleet sandbox service."""

from importlib.metadata import version

__version__ = version("rlfleet-sandbox")
