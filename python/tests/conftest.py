"""A real `ferry serve` on 127.0.0.1 for the tests: started per session,
its port read from its first line, killed by PID at the end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, List, NamedTuple

import pytest

import ferry

REPO = Path(__file__).resolve().parents[2]


def ferry_bin() -> str:
    """The ferry binary to serve with: $FERRY_BIN, else the release build.
    Missing is a failure, not a skip."""
    b = os.environ.get("FERRY_BIN") or str(REPO / "target" / "release" / "ferry")
    if not os.access(b, os.X_OK):
        pytest.fail(f"no ferry binary at {b} (cargo build --release -p ferry-cli, or set FERRY_BIN)")
    return b


class Server(NamedTuple):
    addr: str
    host: str
    port: int
    root: Path
    proc: subprocess.Popen


def start_server(root: Path, *args: str) -> Server:
    p = subprocess.Popen(
        [ferry_bin(), "serve", "--listen", "127.0.0.1:0", "--no-root-squash", *args, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        p.kill()
        p.wait(10)
        pytest.fail(f"ferry serve did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
    hostport = line.split()[-1]
    host, port = hostport.rsplit(":", 1)
    return Server(hostport, host, int(port), root, p)


def stop_server(s: Server) -> None:
    if s.proc.poll() is None:
        os.kill(s.proc.pid, signal.SIGTERM)
        try:
            s.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(s.proc.pid, signal.SIGKILL)
            s.proc.wait(10)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="ferry-py-export-"))
    s = start_server(root, "--no-auth")
    try:
        yield s
    finally:
        stop_server(s)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def client(server: Server) -> ferry.Client:
    return ferry.Client(f"ferry://{server.addr}")


_counter: List[int] = [0]


@pytest.fixture()
def rdir(server: Server, client: ferry.Client) -> Iterator[str]:
    """A fresh directory inside the export (remote path), removed after."""
    _counter[0] += 1
    d = f"/t{os.getpid()}-{_counter[0]}"
    client.mkdir(d)
    yield d
    shutil.rmtree(server.root / d.lstrip("/"), ignore_errors=True)
