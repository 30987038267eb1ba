"""fsspec: the ferry:// protocol by entry point, the file system's own
operations, and fsspec's abstract test suite run against a real server."""

from __future__ import annotations

import os

import fsspec
import pytest
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.open import AbstractOpenTests
from fsspec.tests.abstract.pipe import AbstractPipeTests
from fsspec.tests.abstract.put import AbstractPutTests

from conftest import Server
from ferry.fs import FerryFileSystem


@pytest.fixture()
def ffs(server: Server) -> FerryFileSystem:
    return fsspec.filesystem("ferry", host=server.host, port=server.port)


def test_registered_by_entry_point(server: Server) -> None:
    assert fsspec.get_filesystem_class("ferry") is FerryFileSystem
    fs, path = fsspec.core.url_to_fs(f"ferry://{server.addr}/some/dir/")
    assert isinstance(fs, FerryFileSystem) and path == "/some/dir"
    assert (fs.host, fs.port) == (server.host, server.port)
    assert fs.unstrip_protocol("/x") == f"ferry://{server.addr}/x"
    assert FerryFileSystem._strip_protocol("ferry://h:1//a//b/") == "/a/b"
    assert FerryFileSystem._strip_protocol("ferry://h") == "/"
    assert FerryFileSystem._get_kwargs_from_urls("ferry://[::1]:9/x") == {"host": "::1", "port": 9}


def test_several_gateways_in_one_url(server: Server, rdir: str) -> None:
    """A list of gateways: a dead one is skipped (a port nobody listens on)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    gateways = f"{dead},{server.addr}"
    assert FerryFileSystem._get_kwargs_from_urls(f"ferry://{gateways}/x") == {"gateways": gateways}
    assert FerryFileSystem._strip_protocol(f"ferry://{gateways}//x/") == "/x"
    fs, path = fsspec.core.url_to_fs(f"ferry://{gateways}{rdir}/g.txt")
    assert isinstance(fs, FerryFileSystem) and fs.unstrip_protocol(path) == f"ferry://{gateways}{rdir}/g.txt"
    fs.pipe(path, b"through a gateway that answers")
    assert fs.cat(path) == b"through a gateway that answers"


def test_operations(ffs: FerryFileSystem, server: Server, rdir: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ffs.pipe(f"{rdir}/a/x.bin", b"0123456789")
    ffs.pipe({f"{rdir}/a/y.bin": b"y", f"{rdir}/b/z.bin": b"zz"})
    assert ffs.cat(f"{rdir}/a/x.bin") == b"0123456789"
    assert ffs.cat_file(f"{rdir}/a/x.bin", start=2, end=5) == b"234"
    assert ffs.cat_file(f"{rdir}/a/x.bin", start=-3) == b"789"
    ls = ffs.ls(rdir, detail=True)
    assert sorted((e["name"], e["type"]) for e in ls) == [(f"{rdir}/a", "directory"), (f"{rdir}/b", "directory")]
    assert sorted(ffs.ls(f"{rdir}/a", detail=False)) == [f"{rdir}/a/x.bin", f"{rdir}/a/y.bin"]
    info = ffs.info(f"{rdir}/a/x.bin")
    assert info["size"] == 10 and info["type"] == "file" and info["name"] == f"{rdir}/a/x.bin"
    assert ffs.ls(f"{rdir}/a/x.bin", detail=False) == [f"{rdir}/a/x.bin"]
    with pytest.raises(FileNotFoundError):
        ffs.info(f"{rdir}/nope")
    assert sorted(ffs.find(rdir)) == [f"{rdir}/a/x.bin", f"{rdir}/a/y.bin", f"{rdir}/b/z.bin"]
    assert sorted(ffs.glob(f"{rdir}/*/*.bin")) == sorted(ffs.find(rdir))
    assert ffs.glob(f"ferry://{server.addr}{rdir}/b/*") == [f"{rdir}/b/z.bin"]
    assert ffs.du(rdir) == 13
    # cat_ranges: many ranges of several files, an error among them.
    got = ffs.cat_ranges([f"{rdir}/a/x.bin", f"{rdir}/b/z.bin", f"{rdir}/a/x.bin", f"{rdir}/nope"], [0, 1, 8, 0], [3, 2, 100, 1])
    assert got[:3] == [b"012", b"z", b"89"] and isinstance(got[3], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        ffs.cat_ranges([f"{rdir}/nope"], [0], [1], on_error="raise")
    # put/get recursive.
    local = tmp_path / "src"
    (local / "d").mkdir(parents=True)
    (local / "f1").write_bytes(b"one")
    (local / "d" / "f2").write_bytes(os.urandom(3 * 1024 * 1024))
    ffs.put(str(local), f"{rdir}/up", recursive=True)
    assert (server.root / rdir[1:] / "up" / "d" / "f2").read_bytes() == (local / "d" / "f2").read_bytes()
    ffs.get(f"{rdir}/up", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "d" / "f2").read_bytes() == (local / "d" / "f2").read_bytes()
    assert (tmp_path / "down" / "f1").read_bytes() == b"one"
    # mv is a rename on the server (same inode), rm recursive.
    ino = ffs.info(f"{rdir}/up")["ino"]
    ffs.mv(f"{rdir}/up", f"{rdir}/moved", recursive=True)
    assert ffs.info(f"{rdir}/moved")["ino"] == ino and not ffs.exists(f"{rdir}/up")
    ffs.mv(f"{rdir}/a/x.bin", f"{rdir}/b/")
    assert ffs.cat(f"{rdir}/b/x.bin") == b"0123456789"
    ffs.rm(f"{rdir}/moved", recursive=True)
    assert not ffs.exists(f"{rdir}/moved")
    ffs.rm(f"{rdir}/b/x.bin")
    assert ffs.ls(f"{rdir}/b", detail=False) == [f"{rdir}/b/z.bin"]
    ffs.touch(f"{rdir}/t")
    assert ffs.info(f"{rdir}/t")["size"] == 0
    assert ffs.modified(f"{rdir}/t").year >= 2024
    # Text and open_files through URLs.
    with fsspec.open(f"ferry://{server.addr}{rdir}/text.txt", "wt") as f:
        f.write("line1\nline2\n")
    files = fsspec.open_files(f"ferry://{server.addr}{rdir}/*.txt", "rt")
    assert len(files) == 1
    with files[0] as f:
        assert f.readlines() == ["line1\n", "line2\n"]


def test_token_in_storage_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import start_server, stop_server

    tok = tmp_path / "token"
    tok.write_text("fsspec-token-0123456789")
    os.chmod(tok, 0o600)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "x").write_bytes(b"x!")
    s = start_server(tmp_path / "e", "--token-file", str(tok))
    try:
        url = f"ferry://{s.addr}/x"
        with fsspec.open(url, "rb", token="fsspec-token-0123456789") as f:
            assert f.read() == b"x!"
        with fsspec.open(url, "rb", token_file=str(tok)) as f:
            assert f.read() == b"x!"
    finally:
        stop_server(s)


class FerryFixtures(AbstractFixtures):
    @pytest.fixture
    def fs(self, server: Server) -> FerryFileSystem:  # type: ignore[override]
        return FerryFileSystem(host=server.host, port=server.port)

    @pytest.fixture
    def fs_path(self, rdir: str) -> str:  # type: ignore[override]
        return rdir

    @pytest.fixture
    def fs_join(self):  # type: ignore[no-untyped-def,override]
        return lambda *a: "/".join(a)


class TestFerryCopy(AbstractCopyTests, FerryFixtures):
    pass


class TestFerryGet(AbstractGetTests, FerryFixtures):
    pass


class TestFerryPut(AbstractPutTests, FerryFixtures):
    pass


    pass


class TestFerryOpen(AbstractOpenTests, FerryFixtures):
    pass


class TestFerryPipe(AbstractPipeTests, FerryFixtures):
    pass
