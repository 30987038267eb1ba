"""fsspec file system for ``ferry://host:port/path`` URLs (and
``ferry://h1:p1,h2:p2/path`` for several gateways of one file system).

Registered by an entry point (``fsspec.specs``), so ``fsspec.open``,
``pandas.read_csv("ferry://host:7070/x.csv")`` and friends find it with no
other setup. ``storage_options`` take ``token`` or ``token_file``; without
them the token is found as the ``ferry`` CLI finds it.
"""

from __future__ import annotations

import datetime
import os
import stat as _stat
from typing import Any, Dict, List, Optional, Union

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

from ._client import Client, stat_result

DEFAULT_PORT = 7070
# Copies move this much per request batch (the library splits it into
# requests kept in flight together).
COPY_CHUNK = 8 * 1024 * 1024


def _split_url(path: str) -> "tuple[Optional[str], Optional[int], str]":
    """(host, port, path) of ``ferry://host[:port][/path]``; a path without
    the scheme is returned as is. For several gateways
    (``ferry://h1:p1,h2:p2/path``) the host is the whole list and the port
    None."""
    if not path.startswith("ferry://"):
        return None, None, path
    rest = path[len("ferry://") :]
    i = rest.find("/")
    hostport, p = (rest, "/") if i < 0 else (rest[:i], rest[i:])
    if "," in hostport:
        return hostport, None, p
    if hostport.startswith("["):
        end = hostport.index("]")
        host, tail = hostport[: end + 1], hostport[end + 1 :]
    else:
        host, _, port_s = hostport.rpartition(":")
        if not host:
            host, port_s = hostport, ""
        tail = ":" + port_s if port_s else ""
    port = int(tail[1:]) if tail.startswith(":") and tail[1:] else None
    return host or None, port, p


class FerryFileSystem(AbstractFileSystem):
    """A ferry server's export as an fsspec file system. Paths are
    absolute inside the export (``/dir/file``)."""

    protocol = "ferry"
    root_marker = "/"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: Optional[Union[str, bytes]] = None,
        token_file: Optional[str] = None,
        window: Optional[int] = None,
        gateways: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.host = host
        self.port = int(port)
        # Several gateways of one file system (``h1:7070,h2:7070``): the
        # client uses one that answers and moves when it dies.
        self.gateways = gateways
        addr = gateways or f"{host}:{self.port}"
        self.client = Client(addr, token=token, token_file=token_file, window=window)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        _, _, path = _split_url(path)
        while "//" in path:
            path = path.replace("//", "/")
        path = "/" + path.strip("/")
        return path

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> Dict[str, Any]:
        host, port, _ = _split_url(stringify_path(path))
        out: Dict[str, Any] = {}
        if host and "," in host:
            out["gateways"] = host
        elif host:
            out["host"] = host.strip("[]")
        if port:
            out["port"] = port
        return out

    def unstrip_protocol(self, name: str) -> str:
        if name.startswith("ferry://"):
            return name
        if self.gateways:
            return f"ferry://{self.gateways}{self._strip_protocol(name)}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ferry://{host}:{self.port}{self._strip_protocol(name)}"

    # Metadata

    def _info(self, path: str, st: os.stat_result, link: bool) -> Dict[str, Any]:
        mode = st.st_mode
        if _stat.S_ISDIR(mode):
            kind = "directory"
        elif _stat.S_ISREG(mode):
            kind = "file"
        else:
            kind = "other"
        return {
            "name": path,
            "size": st.st_size if kind != "directory" else 0,
            "type": kind,
            "mode": mode,
            "islink": link,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }

    def _entry_info(self, path: str, st: os.stat_result) -> Dict[str, Any]:
        """Info from ``lstat`` results; a symlink is described by its target
        (a dangling one by itself)."""
        if _stat.S_ISLNK(st.st_mode):
            try:
                return self._info(path, self.client.stat(path), True)
            except OSError:
                return self._info(path, st, True)
        return self._info(path, st, False)

    def info(self, path: Any, **kwargs: Any) -> Dict[str, Any]:
        path = self._strip_protocol(path)
        return self._entry_info(path, self.client.lstat(path))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> List[Any]:
        path = self._strip_protocol(path)
        try:
            entries = self.client._c.scandir(path)
        except NotADirectoryError:
            info = self.info(path)
            return [info] if detail else [info["name"]]
        base = path.rstrip("/")
        out = []
        for name, kind, attr in entries:
            full = f"{base}/{name}"
            if not detail:
                out.append(full)
            elif attr is None:
                out.append(self.info(full))
            else:
                out.append(self._entry_info(full, stat_result(attr)))
        return out

    def modified(self, path: Any) -> datetime.datetime:
        st = self.client.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_mtime, tz=datetime.timezone.utc)

    def created(self, path: Any) -> datetime.datetime:
        st = self.client.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_ctime, tz=datetime.timezone.utc)

    # Names

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if self.exists(path):
            raise FileExistsError(path)
        if create_parents:
            self.client.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path: Any) -> None:
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path: Any) -> None:
        # fsspec's rm passes the directories of an expanded tree here too
        # (deepest first), so an empty directory is removed as well.
        path = self._strip_protocol(path)
        try:
            self.client.remove(path)
        except IsADirectoryError:
            self.client.rmdir(path)

    _rm = rm_file

    def rm(self, path: Any, recursive: bool = False, maxdepth: Optional[int] = None) -> None:
        # A whole tree goes in one pass on the client (no listing first).
        if recursive and maxdepth is None and isinstance(path, str) and not any(c in path for c in "*?["):
            p = self._strip_protocol(path)
            if self.isdir(p):
                self.client.rmtree(p)
                return
        super().rm(path, recursive=recursive, maxdepth=maxdepth)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: Optional[int] = None, **kwargs: Any) -> None:
        """A rename on the server for one path (file or whole directory);
        globs and lists go through fsspec's copy and remove."""
        simple = isinstance(path1, str) and isinstance(path2, str) and not any(c in path1 for c in "*?[")
        if simple:
            src = self._strip_protocol(path1)
            dst = self._strip_protocol(path2)
            if path2.endswith("/") or self.isdir(dst) and not self.isdir(src):
                dst = dst.rstrip("/") + "/" + src.rsplit("/", 1)[-1]
            if src == dst:
                return
            if recursive or not self.isdir(src):
                self.client.rename(src, dst)
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    # Contents

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Any:
        if not autocommit:
            raise NotImplementedError("ferry: transactions are not supported")
        path = self._strip_protocol(path)
        if "w" in mode or "a" in mode or "x" in mode:
            self.client.makedirs(self._parent(path), exist_ok=True)
        return self.client.open(path, mode, buffering=block_size or -1)

    def cat_file(self, path: Any, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        r = self.client.read_ranges([path], [start], [end])[0]
        if isinstance(r, Exception):
            raise r
        return r

    def cat_ranges(
        self,
        paths: List[Any],
        starts: Any,
        ends: Any,
        max_gap: Optional[int] = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> List[Any]:
        """All ranges in one round of pipelined requests (no merging of
        nearby ranges is needed: requests are cheap, round trips are not)."""
        if max_gap is not None:
            raise NotImplementedError
        if not isinstance(paths, list):
            raise TypeError
        if not isinstance(starts, list):
            starts = [starts] * len(paths)
        if not isinstance(ends, list):
            ends = [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError
        out = self.client.read_ranges(self._strip_protocol(paths), starts, ends)
        if on_error == "raise":
            for r in out:
                if isinstance(r, Exception):
                    raise r
        return out

    def pipe_file(self, path: Any, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        self.client.makedirs(self._parent(path), exist_ok=True)
        with self.client.open(path, "xb" if mode == "create" else "wb", buffering=0) as f:
            f.write(value)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        src = self._strip_protocol(path1)
        dst = self._strip_protocol(path2)
        if self.isdir(src):
            self.makedirs(dst, exist_ok=True)
            return
        self.client.makedirs(self._parent(dst), exist_ok=True)
        with self.client.open(src, "rb", buffering=0) as f1, self.client.open(dst, "wb", buffering=0) as f2:
            _copy(f1, f2)

    def put_file(self, lpath: Any, rpath: Any, callback: Any = DEFAULT_CALLBACK, mode: str = "overwrite", **kwargs: Any) -> None:
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        self.client.makedirs(self._parent(rpath), exist_ok=True)
        with open(lpath, "rb", buffering=0) as f1, self.client.open(rpath, "xb" if mode == "create" else "wb", buffering=0) as f2:
            callback.set_size(os.fstat(f1.fileno()).st_size)
            _copy(f1, f2, callback)

    def get_file(self, rpath: Any, lpath: Any, callback: Any = DEFAULT_CALLBACK, outfile: Any = None, **kwargs: Any) -> None:
        rpath = self._strip_protocol(rpath)
        if outfile is None and self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        with self.client.open(rpath, "rb", buffering=0) as f1:
            callback.set_size(f1.size)
            if outfile is not None:
                _copy(f1, outfile, callback)
                return
            parent = os.path.dirname(os.fspath(lpath))
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(lpath, "wb", buffering=0) as f2:
                _copy(f1, f2, callback)

    def touch(self, path: Any, truncate: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")
        else:
            self.client.utime(path)

    def sign(self, path: Any, expiration: int = 100, **kwargs: Any) -> str:
        raise NotImplementedError("ferry has no signed URLs")


def _copy(src: Any, dst: Any, callback: Any = DEFAULT_CALLBACK) -> None:
    """Copies through one reused buffer: each chunk is read into it in place
    and written from it."""
    buf = bytearray(COPY_CHUNK)
    view = memoryview(buf)
    while True:
        n = src.readinto(view)
        if not n:
            break
        written = 0
        while written < n:
            written += dst.write(view[written:n]) or 0
        callback.relative_update(n)
