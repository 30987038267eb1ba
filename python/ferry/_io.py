"""File objects: a ``RawIOBase`` over the native file, wrapped like the
built-in ``open()`` does (``BufferedReader``/``Writer``/``Random``,
``TextIOWrapper``)."""

from __future__ import annotations

import ctypes
import io
import os
from typing import Any, Optional, Union

from . import _ferry

# Reads below 64 KiB are served by the native side's own small-read buffer
# (filled with requests growing to 1 MiB, with read-ahead), so Python's
# buffer only needs to save crossings into native code.
DEFAULT_BUFFER_SIZE = 32 * 1024


def _address(m: memoryview) -> int:
    """Address of a writable buffer; the ctypes object made here keeps it
    exported (so it cannot be resized) until it is dropped."""
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


class RawFile(io.RawIOBase):
    """An open remote file, unbuffered. ``readinto`` fills the caller's
    buffer in place (no intermediate copy); the GIL is released during I/O."""

    def __init__(self, raw: _ferry.RawFile, mode: str) -> None:
        super().__init__()
        self._raw = raw
        self.mode = mode
        self._readable = "r" in mode or "+" in mode
        self._writable = any(c in mode for c in "wax+")

    @property
    def name(self) -> str:
        return self._raw.name

    @property
    def size(self) -> int:
        """Size of the file when it was opened."""
        return self._raw.size

    def readable(self) -> bool:
        self._check_closed()
        return self._readable

    def writable(self) -> bool:
        self._check_closed()
        return self._writable

    def seekable(self) -> bool:
        self._check_closed()
        return True

    def _check_closed(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _check_readable(self) -> None:
        self._check_closed()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")

    def _check_writable(self) -> None:
        self._check_closed()
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")

    def readinto(self, b: Any) -> int:
        self._check_readable()
        with memoryview(b) as view, view.cast("B") as m:
            n = len(m)
            if n == 0:
                return 0
            if m.readonly:
                raise TypeError("readinto() argument must be a writable buffer")
            c = ctypes.c_char.from_buffer(m)
            try:
                return self._raw.readinto_addr(ctypes.addressof(c), n)
            finally:
                del c

    def read(self, size: Optional[int] = -1) -> bytes:
        self._check_readable()
        return self._raw.read(-1 if size is None else size)

    def readall(self) -> bytes:
        return self.read(-1)

    def write(self, b: Any) -> int:
        self._check_writable()
        if isinstance(b, bytes):
            return self._raw.write(b)
        with memoryview(b) as view, view.cast("B") as m:
            n = len(m)
            if n == 0:
                return 0
            if m.readonly:
                return self._raw.write(bytes(m))
            c = ctypes.c_char.from_buffer(m)
            try:
                return self._raw.write_addr(ctypes.addressof(c), n)
            finally:
                del c

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_closed()
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        self._check_closed()
        return self._raw.tell()

    def truncate(self, size: Optional[int] = None) -> int:
        self._check_writable()
        if size is None:
            size = self.tell()
        self._raw.truncate(size)
        return size

    def flush(self) -> None:
        """Waits for the writes in flight (write-behind); raises the first
        failure."""
        super().flush()
        self._raw.flush()

    def fsync(self, datasync: bool = False) -> None:
        self._check_closed()
        self._raw.fsync(datasync)

    def stat(self) -> os.stat_result:
        self._check_closed()
        from ._client import stat_result

        return stat_result(self._raw.fstat())

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            self._raw.close()

    def __repr__(self) -> str:
        return f"<ferry.RawFile name={self.name!r} mode={self.mode!r}>"


class BufferedReader(io.BufferedReader):
    """``io.BufferedReader`` that also tells the file's size (fsspec asks)."""

    @property
    def size(self) -> int:
        return self.raw.size


class BufferedWriter(io.BufferedWriter):
    @property
    def size(self) -> int:
        return self.raw.size


class BufferedRandom(io.BufferedRandom):
    @property
    def size(self) -> int:
        return self.raw.size


def flags_of(mode: str) -> int:
    """``open(2)`` flags for a built-in ``open()`` mode."""
    kinds = sum(c in mode for c in "rwax")
    if kinds != 1 or len(set(mode)) != len(mode) or set(mode) - set("rwax+bt"):
        raise ValueError(f"invalid mode: {mode!r}")
    if "b" in mode and "t" in mode:
        raise ValueError("can't have text and binary mode at once")
    plus = "+" in mode
    if "r" in mode:
        return os.O_RDWR if plus else os.O_RDONLY
    rw = os.O_RDWR if plus else os.O_WRONLY
    if "w" in mode:
        return rw | os.O_CREAT | os.O_TRUNC
    if "a" in mode:
        return rw | os.O_CREAT | os.O_APPEND
    return rw | os.O_CREAT | os.O_EXCL


def wrap(
    raw: _ferry.RawFile,
    mode: str,
    buffering: int = -1,
    encoding: Optional[str] = None,
    errors: Optional[str] = None,
    newline: Optional[str] = None,
) -> Union[RawFile, BufferedReader, BufferedWriter, BufferedRandom, io.TextIOWrapper]:
    """The object the built-in ``open()`` would return for ``mode``."""
    f = RawFile(raw, mode)
    binary = "b" in mode
    if buffering == 0:
        if not binary:
            f.close()
            raise ValueError("can't have unbuffered text I/O")
        return f
    size = DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
    buffered: Union[BufferedReader, BufferedWriter, BufferedRandom]
    if "+" in mode:
        buffered = BufferedRandom(f, size)
    elif "r" in mode:
        buffered = BufferedReader(f, size)
    else:
        buffered = BufferedWriter(f, size)
    if binary:
        return buffered
    text = io.TextIOWrapper(
        buffered, encoding or "utf-8", errors, newline, line_buffering=buffering == 1
    )
    text.mode = mode  # type: ignore[misc]
    return text
