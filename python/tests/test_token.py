"""The token is found as the CLI finds it: the argument, FERRY_TOKEN_FILE,
FERRY_TOKEN, the default file; a missing or wrong one is PermissionError."""

from __future__ import annotations

import os

import pytest

import ferry
from conftest import start_server, stop_server


def test_token_sources(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    export = tmp_path / "export"
    export.mkdir()
    (export / "x").write_bytes(b"secret data")
    tok = tmp_path / "token"
    tok.write_text("s3cret-token-of-some-length\n")
    os.chmod(tok, 0o600)
    s = start_server(export, "--token-file", str(tok))
    try:
        for var in ("FERRY_TOKEN_FILE", "FERRY_TOKEN", "XDG_CONFIG_HOME"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        with pytest.raises(PermissionError) as e:
            ferry.Client(s.addr)
        assert e.value.errno == 13 and "token" in str(e.value)
        with pytest.raises(PermissionError):
            ferry.Client(s.addr, token="wrong")
        assert ferry.Client(s.addr, token="s3cret-token-of-some-length").read_bytes("/x") == b"secret data"
        assert ferry.Client(s.addr, token=b"s3cret-token-of-some-length\n").read_bytes("/x") == b"secret data"
        assert ferry.Client(s.addr, token_file=tok).read_bytes("/x") == b"secret data"
        with pytest.raises(PermissionError):
            ferry.Client(s.addr, token_file=tmp_path / "missing")
        monkeypatch.setenv("FERRY_TOKEN", "s3cret-token-of-some-length")
        assert ferry.Client(s.addr).read_bytes("/x") == b"secret data"
        monkeypatch.delenv("FERRY_TOKEN")
        monkeypatch.setenv("FERRY_TOKEN_FILE", str(tok))
        assert ferry.Client(s.addr).read_bytes("/x") == b"secret data"
        monkeypatch.delenv("FERRY_TOKEN_FILE")
        (tmp_path / "home" / ".config" / "ferry").mkdir(parents=True)
        (tmp_path / "home" / ".config" / "ferry" / "token").write_bytes(tok.read_bytes())
        assert ferry.Client(s.addr).read_bytes("/x") == b"secret data"
    finally:
        stop_server(s)
