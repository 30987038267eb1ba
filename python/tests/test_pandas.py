"""pandas and pyarrow over ferry:// URLs, with no setup beyond the install."""

from __future__ import annotations

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from conftest import Server


def frame(n: int = 1000) -> pd.DataFrame:
    return pd.DataFrame({"id": range(n), "name": [f"row {i}" for i in range(n)], "x": [i * 0.5 for i in range(n)]})


def test_csv_round_trip(server: Server, rdir: str) -> None:
    url = f"ferry://{server.addr}{rdir}/x.csv"
    df = frame()
    df.to_csv(url, index=False)
    assert (server.root / rdir[1:] / "x.csv").read_text().startswith("id,name,x\n0,row 0,0.0\n")
    back = pd.read_csv(url)
    pd.testing.assert_frame_equal(back, df)


def test_csv_written_by_the_server_side(server: Server, rdir: str) -> None:
    (server.root / rdir[1:] / "local.csv").write_text("a,b\n1,2\n3,4\n")
    back = pd.read_csv(f"ferry://{server.addr}{rdir}/local.csv")
    assert back.to_dict("list") == {"a": [1, 3], "b": [2, 4]}


def test_parquet_round_trip(server: Server, rdir: str) -> None:
    url = f"ferry://{server.addr}{rdir}/x.parquet"
    df = frame(50_000)
    df.to_parquet(url)
    pd.testing.assert_frame_equal(pd.read_parquet(url), df)
    # pyarrow directly, with the fsspec file system.
    fs = fsspec.filesystem("ferry", host=server.host, port=server.port)
    table = pq.read_table(f"{rdir}/x.parquet", filesystem=fs)
    assert table.num_rows == 50_000 and table.column("name")[49_999].as_py() == "row 49999"


def test_pyarrow_dataset_over_a_directory(server: Server, rdir: str) -> None:
    fs = fsspec.filesystem("ferry", host=server.host, port=server.port)
    for part in range(3):
        t = pa.table({"v": list(range(part * 100, part * 100 + 100))})
        with fs.open(f"{rdir}/ds/part={part}/data.parquet", "wb") as f:
            pq.write_table(t, f)
    dataset = ds.dataset(f"{rdir}/ds", filesystem=fs, format="parquet", partitioning="hive")
    table = dataset.to_table()
    assert table.num_rows == 300
    assert sorted(table.column("v").to_pylist()) == list(range(300))
    only = dataset.to_table(filter=ds.field("part") == 2)
    assert sorted(only.column("v").to_pylist()) == list(range(200, 300))
    # And pyarrow writing a dataset through it.
    ds.write_dataset(table, f"{rdir}/out", filesystem=fs, format="parquet")
    assert ds.dataset(f"{rdir}/out", filesystem=fs, format="parquet").count_rows() == 300
