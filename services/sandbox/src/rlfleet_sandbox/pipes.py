"""Non-blocking pipe ends on the event loop: a reader that keeps at most `cap` bytes,
and a feeder that writes a buffer and closes. A program must never be able to make the
service buffer without bound or block on it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


class CappedReader:
    """Reads `fd` until EOF or `close()`; keeps the first `cap` bytes. On the first byte
    past the cap, `on_overflow` is called once; later bytes are read and dropped so the
    writer never blocks on a full pipe before it is stopped."""

    def __init__(self, fd: int, cap: int, on_overflow: Callable[[], None]) -> None:
        self._fd = fd
        self._cap = cap
        self._on_overflow = on_overflow
        self._chunks: list[bytes] = []
        self._kept = 0
        self.overflowed = False
        self._loop = asyncio.get_running_loop()
        self.eof: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        room = self._cap - self._kept
        if room > 0:
            kept = chunk[:room]
            self._chunks.append(kept)
            self._kept += len(kept)
        if len(chunk) > max(room, 0) and not self.overflowed:
            self.overflowed = True
            self._on_overflow()

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if not self.eof.done():
            self.eof.set_result(None)

    @property
    def data(self) -> bytes:
        return b"".join(self._chunks)


async def feed(fd: int, data: bytes) -> None:
    """Write `data` to `fd` and close it; stops quietly when the reader goes away (a
    program need not read its stdin)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                written = os.write(fd, view[: 1 << 16])
                view = view[written:]
                continue
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                return
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _resolve, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)
    finally:
        os.close(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
