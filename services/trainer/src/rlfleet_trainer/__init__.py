"""rlfleet trainer service: GRPO (sync and async), torch and megatron backends, exact resume."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlfleet-trainer")
except PackageNotFoundError:  # imported from a source tree (bench/gpu_train.py on a GPU box)
    __version__ = "0+source"
