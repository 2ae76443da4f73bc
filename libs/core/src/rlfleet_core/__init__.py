"""rlfleet-core: what every rlfleet service and the CLI share."""

from importlib.metadata import version

__version__ = version("rlfleet-core")
