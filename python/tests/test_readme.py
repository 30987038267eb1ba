"""The README's Python example, run as written (only the server address
changed to the test server's)."""

from __future__ import annotations

import re

from conftest import REPO, Server


def test_readme_example(server: Server) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Python", 1)[1]
    assert "pip install ./python" in section
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    src = code.group(1).replace("127.0.0.1:7070", server.addr)
    exec(compile(src, "README.md", "exec"), {})
    assert (server.root / "x.parquet").exists()
