"""A client (and files) used after fork, as PyTorch DataLoader workers do:
the child connects again instead of failing, and never touches the
parent's connection. (torch itself is too heavy for the suite; these
workers do what its fork-started workers do.)"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os

import fsspec

import ferry
from conftest import Server

_client: "ferry.Client | None" = None
_dir = ""


def _worker_read(i: int) -> "tuple[int, int, str]":
    assert _client is not None
    data = _client.read_bytes(f"{_dir}/f{i}")
    with _client.open(f"{_dir}/f{i}", "rb") as f:
        f.seek(10)
        part = f.read(100)
    assert part == data[10:110]
    return os.getpid(), i, hashlib.sha256(data).hexdigest()


def test_workers_after_fork(client: ferry.Client, server: Server, rdir: str) -> None:
    global _client, _dir
    want = {}
    for i in range(16):
        data = os.urandom(256 * 1024 + i)
        (server.root / rdir[1:] / f"f{i}").write_bytes(data)
        want[i] = hashlib.sha256(data).hexdigest()
    # The parent uses its connection before and after the workers run.
    assert client.read_bytes(f"{rdir}/f0") == (server.root / rdir[1:] / "f0").read_bytes()
    _client, _dir = client, rdir
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        got = pool.map(_worker_read, range(16))
    assert {i: h for _, i, h in got} == want
    assert all(pid != os.getpid() for pid, _, _ in got)
    assert client.read_bytes(f"{rdir}/f1") == (server.root / rdir[1:] / "f1").read_bytes()
    client.write_bytes(f"{rdir}/after", b"parent still works")
    assert client.read_bytes(f"{rdir}/after") == b"parent still works"


def _child_continues(f, q) -> None:  # type: ignore[no-untyped-def]
    try:
        # The file was opened (and read from) by the parent: the child goes
        # on at the same position over its own connection.
        first = f.read(5)
        f.seek(200_000)  # past what the parent's buffer holds
        q.put(first + f.read(4))
    except BaseException as e:  # report, do not hang the parent
        q.put(repr(e))


def test_file_opened_before_fork(client: ferry.Client, server: Server, rdir: str) -> None:
    data = b"0123456789abcdef" * 20_000
    (server.root / rdir[1:] / "seq").write_bytes(data)
    f = client.open(f"{rdir}/seq", "rb", buffering=0)
    assert f.read(3) == b"012"
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_continues, args=(f, q))
    p.start()
    got = q.get(timeout=30)
    p.join(30)
    assert got == b"34567" + data[200_000:200_004]
    assert p.exitcode == 0
    # The parent's handle is untouched by the child.
    assert f.read(4) == b"3456"
    f.close()


def _fs_worker(args: "tuple[str, int, str]") -> bytes:
    host, port, path = args
    fs = fsspec.filesystem("ferry", host=host, port=port)
    return fs.cat_file(path)


def test_fsspec_instance_across_fork(server: Server, rdir: str) -> None:
    fs = fsspec.filesystem("ferry", host=server.host, port=server.port)
    fs.pipe(f"{rdir}/z", b"zzz")
    with mp.get_context("fork").Pool(2) as pool:
        assert pool.map(_fs_worker, [(server.host, server.port, f"{rdir}/z")] * 4) == [b"zzz"] * 4
    assert fs.cat_file(f"{rdir}/z") == b"zzz"
