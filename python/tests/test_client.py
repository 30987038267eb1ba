"""The path API, errno mapping, file objects, large and ranged reads."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import threading
import time

import pytest

import ferry
from conftest import Server, start_server, stop_server


def test_write_read_stat_listdir(client: ferry.Client, server: Server, rdir: str) -> None:
    client.write_bytes(f"{rdir}/a.txt", b"hello\n")
    assert (server.root / rdir[1:] / "a.txt").read_bytes() == b"hello\n"
    assert client.read_bytes(f"{rdir}/a.txt") == b"hello\n"
    st = client.stat(f"{rdir}/a.txt")
    local = os.stat(server.root / rdir[1:] / "a.txt")
    assert isinstance(st, os.stat_result)
    assert (st.st_size, st.st_ino, st.st_mode, st.st_mtime_ns) == (6, local.st_ino, local.st_mode, local.st_mtime_ns)
    assert stat.S_ISDIR(client.stat(rdir).st_mode)
    client.mkdir(f"{rdir}/sub")
    assert sorted(client.listdir(rdir)) == ["a.txt", "sub"]
    entries = {e.name: e for e in client.scandir(rdir)}
    assert entries["sub"].is_dir() and not entries["sub"].is_file()
    assert entries["a.txt"].is_file() and entries["a.txt"].stat().st_size == 6
    assert entries["a.txt"].path == f"{rdir}/a.txt"
    assert client.exists(f"{rdir}/a.txt") and not client.exists(f"{rdir}/zz")
    assert client.isdir(f"{rdir}/sub") and client.isfile(f"{rdir}/a.txt")


def test_paths_accept_str_bytes_pathlike(client: ferry.Client, rdir: str) -> None:
    from pathlib import PurePosixPath

    client.write_bytes(f"{rdir}/p", b"x")
    assert client.stat(f"{rdir}/p".encode()).st_size == 1
    assert client.stat(PurePosixPath(rdir) / "p").st_size == 1
    with pytest.raises(ValueError):
        client.stat(f"{rdir}/p\0")
    with pytest.raises(TypeError):
        client.stat(3)  # type: ignore[arg-type]


def test_names_that_are_not_utf8_round_trip(client: ferry.Client, server: Server, rdir: str) -> None:
    # Linux names are bytes: as with os.listdir, undecodable bytes come back
    # as surrogate escapes, and either spelling reaches the same file.
    raw = rdir.encode() + b"/caf\xe9"
    client.write_bytes(raw, b"latin-1 name")
    assert (server.root / rdir[1:] / os.fsdecode(b"caf\xe9")).exists()
    names = client.listdir(rdir)
    assert names == [os.fsdecode(b"caf\xe9")]
    assert client.read_bytes(f"{rdir}/{names[0]}") == b"latin-1 name"
    client.rename(raw, rdir.encode() + b"/\xff\xfe")
    assert client.listdir(rdir) == [os.fsdecode(b"\xff\xfe")]


def test_names(client: ferry.Client, server: Server, rdir: str) -> None:
    client.makedirs(f"{rdir}/a/b/c")
    client.makedirs(f"{rdir}/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        client.makedirs(f"{rdir}/a/b/c")
    client.write_bytes(f"{rdir}/a/f", b"1")
    client.rename(f"{rdir}/a/f", f"{rdir}/a/g")
    assert client.listdir(f"{rdir}/a") == ["b", "g"] or sorted(client.listdir(f"{rdir}/a")) == ["b", "g"]
    client.write_bytes(f"{rdir}/a/h", b"2")
    with pytest.raises(FileExistsError):
        client.rename(f"{rdir}/a/g", f"{rdir}/a/h", noreplace=True)
    client.replace(f"{rdir}/a/g", f"{rdir}/a/h")
    assert client.read_bytes(f"{rdir}/a/h") == b"1"
    client.symlink("h", f"{rdir}/a/l")
    assert client.readlink(f"{rdir}/a/l") == "h"
    assert stat.S_ISLNK(client.lstat(f"{rdir}/a/l").st_mode)
    assert client.stat(f"{rdir}/a/l").st_size == 1
    client.link(f"{rdir}/a/h", f"{rdir}/a/hard")
    assert client.stat(f"{rdir}/a/hard").st_nlink == 2
    client.chmod(f"{rdir}/a/h", 0o600)
    assert stat.S_IMODE(client.stat(f"{rdir}/a/h").st_mode) == 0o600
    client.utime(f"{rdir}/a/h", ns=(1_000_000_123, 2_000_000_456))
    st = client.stat(f"{rdir}/a/h")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456)
    client.utime(f"{rdir}/a/h", (10.5, 20.25))
    assert client.stat(f"{rdir}/a/h").st_mtime == 20.25
    client.utime(f"{rdir}/a/h")
    assert abs(client.stat(f"{rdir}/a/h").st_mtime - time.time()) < 60
    client.truncate(f"{rdir}/a/h", 5)
    assert client.read_bytes(f"{rdir}/a/h") == b"1\0\0\0\0"
    assert client.access(f"{rdir}/a/h", os.R_OK) and not client.access(f"{rdir}/zz", os.R_OK)
    assert client.statvfs("/").f_bsize > 0
    client.remove(f"{rdir}/a/hard")
    client.unlink(f"{rdir}/a/l")
    client.rmtree(f"{rdir}/a")
    assert client.listdir(rdir) == []
    walked = list(client.walk(rdir))
    assert walked == [(rdir, [], [])]


@pytest.mark.parametrize(
    "op, exc, code",
    [
        (lambda c, d: c.stat(f"{d}/missing"), FileNotFoundError, errno.ENOENT),
        (lambda c, d: c.open(f"{d}/missing/x", "w"), FileNotFoundError, errno.ENOENT),
        (lambda c, d: c.mkdir(d), FileExistsError, errno.EEXIST),
        (lambda c, d: c.open(f"{d}/f", "x"), FileExistsError, errno.EEXIST),
        (lambda c, d: c.listdir(f"{d}/f"), NotADirectoryError, errno.ENOTDIR),
        (lambda c, d: c.stat(f"{d}/f/x"), NotADirectoryError, errno.ENOTDIR),
        (lambda c, d: c.open(d, "w"), IsADirectoryError, errno.EISDIR),
        (lambda c, d: c.rmdir(f"{d}/sub"), OSError, errno.ENOTEMPTY),
        (lambda c, d: c.rmdir(f"{d}/f"), NotADirectoryError, errno.ENOTDIR),
        (lambda c, d: c.readlink(f"{d}/f"), OSError, errno.EINVAL),
        (lambda c, d: c.rename(d, f"{d}/sub/inside"), OSError, errno.EINVAL),
    ],
)
def test_errno_mapping(client: ferry.Client, rdir: str, op, exc, code) -> None:  # type: ignore[no-untyped-def]
    client.write_bytes(f"{rdir}/f", b"x")
    client.makedirs(f"{rdir}/sub/deeper")
    with pytest.raises(exc) as e:
        op(client, rdir)
    assert e.value.errno == code
    assert e.value.filename is not None and e.value.filename.startswith(rdir)


def test_read_only_server_says_erofs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "x").write_bytes(b"1")
    s = start_server(tmp_path, "--no-auth", "--read-only")
    try:
        c = ferry.Client(s.addr)
        assert c.read_bytes("/x") == b"1"
        with pytest.raises(OSError) as e:
            c.write_bytes("/x", b"2")
        assert e.value.errno == errno.EROFS
    finally:
        stop_server(s)


def test_connection_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = start_server(tmp_path, "--no-auth")
    addr = s.addr
    c = ferry.Client(addr)
    c.write_bytes("/x", b"1")
    stop_server(s)
    with pytest.raises(ConnectionError):
        c.read_bytes("/x")
    with pytest.raises(ConnectionRefusedError) as e:
        ferry.Client(addr)
    assert e.value.errno == errno.ECONNREFUSED
    with pytest.raises(ValueError):
        ferry.Client("nfs://127.0.0.1/x")


def test_file_objects(client: ferry.Client, rdir: str) -> None:
    p = f"{rdir}/f.txt"
    with client.open(p, "w") as f:
        assert isinstance(f, io.TextIOWrapper) and f.writable() and not f.readable()
        f.write("one\ntwo\nthree ünïcode\n")
    with client.open(p) as f:
        assert f.readline() == "one\n"
        assert f.readlines() == ["two\n", "three ünïcode\n"]
    with client.open(p, "rb") as f:
        assert isinstance(f, io.BufferedReader)
        assert f.size == len("one\ntwo\nthree ünïcode\n".encode())
        assert f.read(3) == b"one"
        assert f.tell() == 3
        f.seek(-7, io.SEEK_END)
        assert f.read() == "nïcode\n".encode()[-7:]
        f.seek(4)
        assert f.readline() == b"two\n"
        assert list(f) == ["three ünïcode\n".encode()]
    with client.open(p, "ab") as f:
        f.write(b"four\n")
    with client.open(p, "r+b") as f:
        f.seek(0)
        f.write(b"ONE")
        f.seek(0)
        assert f.read(4) == b"ONE\n"
        f.truncate(8)
    assert client.read_bytes(p) == b"ONE\ntwo\n"
    with client.open(p, "rb", buffering=0) as f:
        assert f.read() == b"ONE\ntwo\n"
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
        with pytest.raises(io.UnsupportedOperation):
            f.fileno()
    assert f.closed
    with pytest.raises(ValueError):
        f.read()
    with pytest.raises(ValueError):
        client.open(p, "rw")
    with pytest.raises(FileExistsError):
        client.open(p, "xb")
    with client.open(f"{rdir}/new", "xb") as f:
        f.write(b"n")
        f.flush()
        f.raw.fsync()
        assert f.raw.stat().st_size == 1


def test_readinto_fills_callers_buffer(client: ferry.Client, server: Server, rdir: str) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    (server.root / rdir[1:] / "big").write_bytes(data)
    buf = bytearray(len(data) + 100)
    with client.open(f"{rdir}/big", "rb", buffering=0) as f:
        assert f.readinto(buf) == len(data)
        assert f.readinto(buf) == 0
    assert buf[: len(data)] == data
    # Into the middle of a memoryview, and into a numpy array.
    buf2 = bytearray(200)
    with client.open(f"{rdir}/big", "rb", buffering=0) as f:
        f.seek(1000)
        assert f.readinto(memoryview(buf2)[50:150]) == 100
    assert buf2[50:150] == data[1000:1100] and buf2[:50] == bytes(50)
    import numpy as np  # installed with pandas by python/test.sh
    arr = np.zeros(1024, dtype=np.uint32)
    with client.open(f"{rdir}/big", "rb") as f:
        assert f.readinto(arr) == 4096
    assert arr.tobytes() == data[:4096]
    with client.open(f"{rdir}/big", "rb", buffering=0) as f, pytest.raises(TypeError):
        f.readinto(b"read-only")


def test_large_sequential_and_ranged_reads(client: ferry.Client, server: Server, rdir: str) -> None:
    size = 96 * 1024 * 1024 + 12345
    local = server.root / rdir[1:] / "large"
    with open(local, "wb") as f:
        for i in range(size // (1 << 20) + 1):
            f.write(hashlib.sha256(str(i).encode()).digest() * 32768)
        f.truncate(size)
    want = hashlib.sha256(local.read_bytes()).hexdigest()
    h = hashlib.sha256()
    with client.open(f"{rdir}/large", "rb") as f:
        while chunk := f.read(4 * 1024 * 1024):
            h.update(chunk)
    assert h.hexdigest() == want
    h = hashlib.sha256()
    with client.open(f"{rdir}/large", "rb") as f:
        for line in f:  # small reads through the buffers
            h.update(line)
    assert h.hexdigest() == want
    assert hashlib.sha256(client.read_bytes(f"{rdir}/large")).hexdigest() == want
    # Ranged reads: many ranges, one larger than a request, one past the end,
    # negative starts, and a missing file among them.
    raw = local.read_bytes()
    starts = [0, 5, size - 10, 70 * 1024 * 1024, -100, size + 5, 0]
    ends = [10, 64 * 1024 * 1024 + 7, None, 70 * 1024 * 1024 + 65536, None, size + 10, 1]
    paths = [f"{rdir}/large"] * 6 + [f"{rdir}/missing"]
    got = client.read_ranges(paths, starts, ends)
    for s, e, g in zip(starts[:6], ends[:6], got[:6]):
        assert g == raw[s:e]
    assert isinstance(got[6], FileNotFoundError)
    # Sequential writes (write-behind) of the same data.
    with client.open(f"{rdir}/copy", "wb") as f:
        view = memoryview(raw)
        for off in range(0, size, 3 * 1024 * 1024):
            f.write(view[off : off + 3 * 1024 * 1024])
    assert hashlib.sha256((server.root / rdir[1:] / "copy").read_bytes()).hexdigest() == want


def test_threads_overlap_with_gil_released(client: ferry.Client, server: Server, rdir: str) -> None:
    """While one thread reads 64 MiB, another keeps running Python code."""
    (server.root / rdir[1:] / "t").write_bytes(os.urandom(64 * 1024 * 1024))
    ticks = 0
    done = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    buf = bytearray(64 * 1024 * 1024)
    t = threading.Thread(target=spin)
    t.start()
    try:
        rounds = 0
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            before = ticks
            with client.open(f"{rdir}/t", "rb", buffering=0) as f:
                f.readinto(buf)
            rounds += 1
    finally:
        done.set()
        t.join()
    # With the GIL held during I/O the spinner would only run at the
    # switch interval between calls; here it runs throughout.
    assert ticks - before > 1000, (ticks, before, rounds)
    # Several threads reading at once share one pipelined connection.
    results = {}

    def reader(i: int) -> None:
        with client.open(f"{rdir}/t", "rb") as f:
            f.seek(i * 1024 * 1024)
            results[i] = f.read(1024 * 1024)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    whole = (server.root / rdir[1:] / "t").read_bytes()
    for i in range(8):
        assert results[i] == whole[i * 1024 * 1024 : (i + 1) * 1024 * 1024]
