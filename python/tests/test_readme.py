"""The Python example of docs/python.md, run as written (only the server
address changed to the test server's). Its install commands are run by
python/test.sh, which made the environment this runs in."""

from __future__ import annotations

import re

from conftest import REPO, Server


def test_docs_example(server: Server) -> None:
    page = (REPO / "docs" / "python.md").read_text()
    install = re.search(r"```sh test-python\n(.*?)```", page, re.S)
    assert install is not None and "pip install ./python" in install.group(1)
    assert "pandas pyarrow" in install.group(1)
    code = re.search(r"```python\n(.*?)```", page, re.S)
    assert code is not None
    src = code.group(1).replace("127.0.0.1:7070", server.addr)
    exec(compile(src, "docs/python.md", "exec"), {})
    assert (server.root / "x.parquet").exists()
