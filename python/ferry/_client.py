"""``ferry.Client``: the path operations of the Rust client library."""

from __future__ import annotations

import os
import stat as _stat
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _ferry
from ._io import flags_of, wrap

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
StatTuple = Tuple[
    Tuple[int, int, int, int, int, int, int], Tuple[int, int, int], Tuple[int, int, int]
]

_NS = 1_000_000_000


def stat_result(t: StatTuple) -> os.stat_result:
    """An ``os.stat_result`` from the native tuple."""
    (mode, ino, dev, nlink, uid, gid, size), (a, m, c), (blksize, blocks, rdev) = t
    return os.stat_result(
        (mode, ino, dev, nlink, uid, gid, size, a // _NS, m // _NS, c // _NS),
        {
            "st_atime": a / _NS,
            "st_mtime": m / _NS,
            "st_ctime": c / _NS,
            "st_atime_ns": a,
            "st_mtime_ns": m,
            "st_ctime_ns": c,
            "st_blksize": blksize,
            "st_blocks": blocks,
            "st_rdev": rdev,
        },
    )


class DirEntry:
    """One entry of :meth:`Client.scandir`, shaped like ``os.DirEntry``."""

    __slots__ = ("name", "path", "_kind", "_lstat", "_client")

    def __init__(self, client: "Client", dir: str, name: str, kind: int, attr: Optional[StatTuple]):
        self.name = name
        self.path = dir.rstrip("/") + "/" + name
        self._kind = kind
        self._lstat = stat_result(attr) if attr is not None else None
        self._client = client

    def _mode(self, follow: bool) -> int:
        if follow and self.is_symlink():
            try:
                return self._client.stat(self.path).st_mode
            except FileNotFoundError:
                return 0
        if self._lstat is not None:
            return self._lstat.st_mode
        return {4: _stat.S_IFDIR, 8: _stat.S_IFREG, 10: _stat.S_IFLNK}.get(self._kind, 0)

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return _stat.S_ISDIR(self._mode(follow_symlinks))

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return _stat.S_ISREG(self._mode(follow_symlinks))

    def is_symlink(self) -> bool:
        if self._lstat is not None:
            return _stat.S_ISLNK(self._lstat.st_mode)
        return self._kind == 10

    def inode(self) -> int:
        return self.stat(follow_symlinks=False).st_ino

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        if follow_symlinks and self.is_symlink() or self._lstat is None:
            return self._client.stat(self.path, follow_symlinks=follow_symlinks)
        return self._lstat

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<ferry.DirEntry {self.name!r}>"


class Client:
    """A connection to one ferry server.

    ``url`` is ``ferry://host[:port]`` or ``host[:port]`` (port 7070 by
    default). The token is ``token``, else read from ``token_file``, else
    found as the ``ferry`` CLI finds it: ``FERRY_TOKEN_FILE``,
    ``FERRY_TOKEN``, then ``$XDG_CONFIG_HOME/ferry/token`` or
    ``~/.config/ferry/token``. Paths are absolute inside the export.

    Safe to share between threads (requests of all threads are pipelined on
    one connection) and across ``fork``: a child makes its own connection on
    first use, and files it inherited are reopened there at the same
    position.
    """

    def __init__(
        self,
        url: str,
        token: Optional[Union[str, bytes]] = None,
        token_file: Optional[Union[str, "os.PathLike[str]"]] = None,
        window: Optional[int] = None,
    ) -> None:
        self._c = _ferry.Client(url, token, token_file, window)

    @property
    def addr(self) -> str:
        """``host:port`` of the server."""
        return self._c.addr

    def __repr__(self) -> str:
        return f"ferry.Client('ferry://{self.addr}')"

    def ping(self) -> None:
        self._c.ping()

    # Metadata

    def stat(self, path: PathLike, *, follow_symlinks: bool = True) -> os.stat_result:
        return stat_result(self._c.stat(path, follow_symlinks))

    def lstat(self, path: PathLike) -> os.stat_result:
        return stat_result(self._c.stat(path, False))

    def exists(self, path: PathLike) -> bool:
        try:
            self._c.stat(path, True)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isdir(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def scandir(self, path: PathLike = "/") -> List[DirEntry]:
        """All entries except ``.`` and ``..``, with their attributes (one
        request per batch of entries, not one per entry)."""
        d = os.fsdecode(os.fspath(path))
        return [DirEntry(self, d, n, k, a) for n, k, a in self._c.scandir(path)]

    def listdir(self, path: PathLike = "/") -> List[str]:
        return [n for n, _, _ in self._c.scandir(path)]

    def statvfs(self, path: PathLike = "/") -> os.statvfs_result:
        *fields, fsid = self._c.statvfs(path)
        return os.statvfs_result(tuple(fields), {"f_fsid": fsid})

    def access(self, path: PathLike, mode: int) -> bool:
        return self._c.access(path, mode)

    def chmod(self, path: PathLike, mode: int, *, follow_symlinks: bool = True) -> None:
        self._c.chmod(path, mode, follow_symlinks)

    def chown(self, path: PathLike, uid: int, gid: int, *, follow_symlinks: bool = True) -> None:
        self._c.chown(path, uid, gid, follow_symlinks)

    def utime(
        self,
        path: PathLike,
        times: Optional[Tuple[float, float]] = None,
        *,
        ns: Optional[Tuple[int, int]] = None,
        follow_symlinks: bool = True,
    ) -> None:
        """Like ``os.utime``: neither ``times`` nor ``ns`` means now."""
        if times is not None and ns is not None:
            raise ValueError("utime: you may specify either 'times' or 'ns' but not both")
        if times is not None:
            ns = (int(times[0] * _NS), int(times[1] * _NS))
        self._c.utime(path, ns, follow_symlinks)

    def truncate(self, path: PathLike, length: int) -> None:
        self._c.truncate(path, length)

    def getxattr(self, path: PathLike, name: str, *, follow_symlinks: bool = True) -> bytes:
        return self._c.getxattr(path, name, follow_symlinks)

    def setxattr(
        self, path: PathLike, name: str, value: bytes, flags: int = 0, *, follow_symlinks: bool = True
    ) -> None:
        self._c.setxattr(path, name, value, flags, follow_symlinks)

    def listxattr(self, path: PathLike, *, follow_symlinks: bool = True) -> List[str]:
        return self._c.listxattr(path, follow_symlinks)

    def removexattr(self, path: PathLike, name: str, *, follow_symlinks: bool = True) -> None:
        self._c.removexattr(path, name, follow_symlinks)

    # Names

    def mkdir(self, path: PathLike, mode: int = 0o777) -> None:
        self._c.mkdir(path, mode)

    def makedirs(self, path: PathLike, mode: int = 0o777, exist_ok: bool = False) -> None:
        self._c.makedirs(path, mode, exist_ok)

    def remove(self, path: PathLike) -> None:
        self._c.remove(path)

    unlink = remove

    def rmdir(self, path: PathLike) -> None:
        self._c.rmdir(path)

    def rmtree(self, path: PathLike) -> None:
        """``rm -r``: symlinks are removed, never followed."""
        self._c.rmtree(path)

    def rename(self, src: PathLike, dst: PathLike, *, noreplace: bool = False) -> None:
        """Replaces ``dst`` (as ``os.rename`` on Linux) unless ``noreplace``."""
        self._c.rename(src, dst, noreplace)

    replace = rename

    def link(self, src: PathLike, dst: PathLike) -> None:
        self._c.link(src, dst)

    def symlink(self, target: PathLike, path: PathLike) -> None:
        self._c.symlink(target, path)

    def readlink(self, path: PathLike) -> str:
        return self._c.readlink(path)

    # Contents

    def open(
        self,
        path: PathLike,
        mode: str = "r",
        buffering: int = -1,
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        newline: Optional[str] = None,
        *,
        perm: int = 0o666,
    ) -> Any:
        """Like the built-in ``open()`` (text is UTF-8 unless ``encoding``
        says otherwise); ``perm`` is the permission of a created file."""
        raw = self._c.open(path, flags_of(mode), perm)
        return wrap(raw, mode, buffering, encoding, errors, newline)

    def read_bytes(self, path: PathLike) -> bytes:
        return self._c.read_bytes(path)

    def write_bytes(self, path: PathLike, data: bytes) -> None:
        self._c.write_bytes(path, bytes(data))

    def read_text(self, path: PathLike, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes(path).decode(encoding, errors)

    def write_text(self, path: PathLike, data: str, encoding: str = "utf-8", errors: str = "strict") -> None:
        self.write_bytes(path, data.encode(encoding, errors))

    def read_ranges(
        self,
        paths: Sequence[PathLike],
        starts: Sequence[Optional[int]],
        ends: Sequence[Optional[int]],
    ) -> List[Union[bytes, OSError]]:
        """Byte ranges ``paths[i][starts[i]:ends[i]]`` (slice rules), all
        requested in one round of pipelined requests. A range that fails
        is its ``OSError`` in the result, not raised."""
        return self._c.read_ranges(list(paths), list(starts), list(ends))

    def walk(self, top: PathLike = "/") -> Iterable[Tuple[str, List[str], List[str]]]:
        """Like ``os.walk`` (top-down, symlinks not followed)."""
        top_s = os.fsdecode(os.fspath(top))
        dirs: List[str] = []
        files: List[str] = []
        for e in self.scandir(top_s):
            (dirs if e.is_dir(follow_symlinks=False) else files).append(e.name)
        yield top_s, dirs, files
        for d in dirs:
            yield from self.walk(top_s.rstrip("/") + "/" + d)
