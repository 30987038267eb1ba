#!/usr/bin/env python3
"""Benchmark of the Python package against the Rust library, same run.

1. Sequential read of a file (1 GiB by default) from Python: ``readinto``
   into a preallocated 1 MiB buffer, and one ``readinto`` filling a buffer
   the size of the file; beside the Rust library reading the same file from
   the same server in 1 MiB reads (a ``ferry compare`` worker), each run of
   one next to a run of the other.
2. ``cat_ranges`` of 1,000 random 64 KiB ranges against one ``seek`` +
   ``read`` per range on an open file.
3. The same sequential read through fsspec's SFTP implementation (paramiko)
   over a private ``sshd`` on 127.0.0.1, what these users would otherwise
   pick: needs ``/usr/sbin/sshd`` (Debian: openssh-server) and ``pip install
   paramiko``; without them the line says why it was skipped.

Medians of ``--runs`` (3). Clients (Python and the Rust worker) pinned to
CPU 0 and the server to CPU 1. Usage (after ``pip install ./python``):

    python python/bench.py [--size-mib 1024] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import sys

# The installed package, not the source directory beside this script (which
# lacks the compiled module).
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import ferry  # noqa: E402
from ferry.fs import FerryFileSystem  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def start_sshd(work: str) -> "tuple[subprocess.Popen, int, str]":
    """A private sshd on 127.0.0.1 with fresh host and user keys, for the
    current user only (key login). Returns it, its port and the key file."""
    import socket

    for name in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(work, name)], check=True)
    shutil.copy(os.path.join(work, "user.pub"), os.path.join(work, "authorized_keys"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = os.path.join(work, "sshd_config")
    with open(cfg, "w") as f:
        f.write(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work}/host\nPidFile {work}/sshd.pid\n"
            f"AuthorizedKeysFile {work}/authorized_keys\nPasswordAuthentication no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\nUsePAM no\nSubsystem sftp internal-sftp\n"
        )
    os.makedirs("/run/sshd", exist_ok=True)
    p = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", cfg], stderr=subprocess.DEVNULL, preexec_fn=lambda: pin(1))
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p, port, os.path.join(work, "user")
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("sshd did not start")


def sftp_read(path: str, size: int, runs: int) -> str:
    """The first `size` bytes of `path` read through fsspec's SFTP file
    system in 1 MiB reads: the median line, or why it was not measured."""
    if not os.path.exists("/usr/sbin/sshd"):
        return "not measured: /usr/sbin/sshd missing (apt-get install openssh-server)"
    try:
        import fsspec
        import paramiko  # noqa: F401
    except ImportError:
        return "not measured: paramiko missing (pip install paramiko)"
    import getpass

    work = tempfile.mkdtemp(prefix="ferry-pybench-ssh-")
    sshd = None
    try:
        sshd, port, key = start_sshd(work)
        fs = fsspec.filesystem("sftp", host="127.0.0.1", port=port, username=getpass.getuser(), key_filename=key)
        times = []
        for _ in range(runs):
            with fs.open(path, "rb") as f:
                t0 = time.perf_counter()
                n = 0
                while n < size:
                    b = f.read(min(1024 * 1024, size - n))
                    if not b:
                        break
                    n += len(b)
                times.append(time.perf_counter() - t0)
            assert n == size, (n, size)
        return median_mbs(size, times)
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def pin(cpu: int) -> None:
    if len(os.sched_getaffinity(0)) > 1 and os.cpu_count() and os.cpu_count() > cpu:
        os.sched_setaffinity(0, {cpu})


def start_server(ferry_bin: str, root: str) -> "tuple[subprocess.Popen, str]":
    p = subprocess.Popen(
        [ferry_bin, "serve", "--no-auth", "--no-root-squash", "--listen", "127.0.0.1:0", root],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: pin(1),
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        p.kill()
        raise SystemExit(f"ferry serve did not start: {line!r}")
    return p, line.split()[-1]


def rust_read(ferry_bin: str, addr: str, size: int) -> float:
    """Seconds the Rust library takes to read /big in 1 MiB `read`s, as the
    Python loop does: a `ferry compare` worker on the same server, pinned to
    the same CPU (it inherits this process's mask)."""
    out = subprocess.run(
        [ferry_bin, "compare", "--worker", f"ferry://{addr}/", "read", "/big", str(1 << 20), str(size)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"bytes=(\d+) secs=([\d.]+)", out)
    if not m or int(m.group(1)) != size:
        raise SystemExit(f"the Rust worker did not read the file: {out!r}")
    return float(m.group(2))


def median_mbs(size: int, times: "list[float]") -> str:
    rates = [size / t / 1e6 for t in times]
    return f"{statistics.median(rates):8.1f} MB/s  ({min(rates):.1f}..{max(rates):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ranges", type=int, default=1000)
    ap.add_argument("--range-kib", type=int, default=64)
    ap.add_argument("--ferry", default=os.environ.get("FERRY_BIN", str(REPO / "target/release/ferry")))
    a = ap.parse_args()
    size = a.size_mib * 1024 * 1024
    root = tempfile.mkdtemp(prefix="ferry-pybench-")
    proc = None
    try:
        with open(os.path.join(root, "big"), "wb") as f:
            block = os.urandom(1024 * 1024)
            for _ in range(a.size_mib):
                f.write(block)
        proc, addr = start_server(a.ferry, root)
        pin(0)
        c = ferry.Client(addr)
        buf = bytearray(1024 * 1024)
        whole = bytearray(size)
        t_block, t_whole, t_rust = [], [], []
        for _ in range(a.runs):
            t_rust.append(rust_read(a.ferry, addr, size))
            with c.open("/big", "rb", buffering=0) as f:
                t0 = time.perf_counter()
                n = 0
                while True:
                    k = f.readinto(buf)
                    if not k:
                        break
                    n += k
                t_block.append(time.perf_counter() - t0)
                assert n == size
            with c.open("/big", "rb", buffering=0) as f:
                t0 = time.perf_counter()
                assert f.readinto(whole) == size
                t_whole.append(time.perf_counter() - t0)
        del whole

        fs = FerryFileSystem(host=addr.rsplit(":", 1)[0], port=int(addr.rsplit(":", 1)[1]))
        rng = random.Random(7)
        rlen = a.range_kib * 1024
        starts = [rng.randrange(0, size - rlen) for _ in range(a.ranges)]
        ends = [s + rlen for s in starts]
        paths = ["/big"] * a.ranges
        t_ranges, t_loop = [], []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            got = fs.cat_ranges(paths, starts, ends)
            t_ranges.append(time.perf_counter() - t0)
            assert all(len(g) == rlen for g in got)
            with c.open("/big", "rb", buffering=0) as f:
                t0 = time.perf_counter()
                for s in starts:
                    f.seek(s)
                    assert len(f.read(rlen)) == rlen
                t_loop.append(time.perf_counter() - t0)

        py = statistics.median(size / t / 1e6 for t in t_block)
        rust = statistics.median(size / t / 1e6 for t in t_rust)
        print(f"ferry Python benchmark: {a.size_mib} MiB file, {a.runs} runs, medians (min..max)")
        print(f"Python readinto, 1 MiB buffer        {median_mbs(size, t_block)}   {py / rust * 100:.0f} % of the Rust library")
        print(f"Python readinto, one {a.size_mib} MiB buffer  {median_mbs(size, t_whole)}")
        print(f"Rust library, 1 MiB reads            {median_mbs(size, t_rust)}")
        # At SFTP's speed a whole GiB takes minutes a run: its first 128 MiB.
        sftp_size = min(size, 128 << 20)
        sftp = sftp_read(os.path.join(root, "big"), sftp_size, a.runs)
        print(f"fsspec SFTP (paramiko), first {sftp_size >> 20} MiB {sftp}")
        tr, tl = statistics.median(t_ranges), statistics.median(t_loop)
        print(f"cat_ranges, {a.ranges} x {a.range_kib} KiB          {tr * 1000:8.1f} ms  ({rlen * a.ranges / tr / 1e6:.0f} MB/s)")
        print(f"seek + read per range               {tl * 1000:8.1f} ms  ({rlen * a.ranges / tl / 1e6:.0f} MB/s)  cat_ranges {tl / tr:.1f}x faster")
    finally:
        if proc is not None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
