"""Filesystem transport: the trainer writes one safetensors file per version into a folder
both sides can read (`services.shared_dir`) and sends its path in `UpdateWeights`
(`WEIGHT_TRANSPORT_SHARED_FILE`); the rollout loads it. The file appears under its final
name only once complete (written to a temporary name, then renamed), so a reader never
sees half a file; older versions are removed once the rollout has answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfleet_proto.v1 import rollout_pb2

from rlfleet_weights.base import (
    IncomingWeights,
    WeightPublish,
    WeightReceiver,
    WeightRequestError,
    WeightSender,
)
from rlfleet_weights.plan import tensor_spec

if TYPE_CHECKING:
    import torch

FILE_PREFIX = "weights_v"
FILE_SUFFIX = ".safetensors"


def weights_file(folder: Path, version: int) -> Path:
    return folder / f"{FILE_PREFIX}{version}{FILE_SUFFIX}"


def write_weights_file(folder: Path, version: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Write `tensors` as `version`'s file in `folder`, atomically; its path."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    final = weights_file(folder, version)
    tmp = final.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(final)
    return final


def remove_older_files(folder: Path, keep: Path) -> None:
    for old in folder.glob(f"{FILE_PREFIX}*{FILE_SUFFIX}"):
        if old != keep:
            old.unlink(missing_ok=True)


def read_weights_file(path: str) -> dict[str, Any]:
    """The tensors of a weights file; ValueError naming the path when it cannot be read."""
    if not path:
        raise ValueError("SHARED_FILE needs the path of a safetensors file")
    from safetensors.torch import load_file

    try:
        return dict(load_file(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


class FilesystemSender(WeightSender):
    def __init__(self, stub: Any, bucket_bytes: int, shared_dir: Path) -> None:
        super().__init__(stub, bucket_bytes)
        self.shared_dir = shared_dir

    async def publish(
        self, update: WeightPublish, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> rollout_pb2.UpdateWeightsResponse:
        # A clone: the trainer may update its parameters while the file is written.
        items = {name: t.detach().cpu().clone().contiguous() for name, t in tensors}
        final = write_weights_file(self.shared_dir, update.version, items)
        request = rollout_pb2.UpdateWeightsRequest(
            weight_version=update.version,
            transport=rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE,
            tensors=[tensor_spec(n, t) for n, t in items.items()],
            file_path=str(final),
        )
        reply: rollout_pb2.UpdateWeightsResponse = await self.stub.UpdateWeights(
            request, timeout=600.0
        )
        remove_older_files(self.shared_dir, final)
        return reply


def check_weights_path(path: str, roots: Iterable[str], setting: str) -> None:
    """WeightRequestError("file_path") unless `path`, symlinks resolved, lies in one of
    `roots`: an update must not make the rollout read any file of its host. `setting`
    names the configuration that lists the roots, for the message."""
    allowed = [Path(r).resolve() for r in roots]
    resolved = Path(path).resolve()
    if not any(resolved.is_relative_to(root) for root in allowed):
        raise WeightRequestError(
            "file_path",
            f"{path} is outside the folders weight files may come from "
            f"({setting}={[str(r) for r in allowed]})",
        )


class FilesystemReceiver(WeightReceiver):
    """UpdateWeights(SHARED_FILE): the tensors of the file at `file_path` (the caller
    checks the path first, with `check_weights_path`)."""

    def receive(self, request: rollout_pb2.UpdateWeightsRequest) -> IncomingWeights:
        try:
            return IncomingWeights(tensors=read_weights_file(request.file_path))
        except ValueError as exc:
            raise WeightRequestError("file_path", str(exc)) from None
