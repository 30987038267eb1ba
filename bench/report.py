#!/usr/bin/env python3
"""Plots and markdown tables from `ferry compare --out DIR` results.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install matplotlib
    /tmp/venv/bin/python bench/report.py docs/bench          # writes docs/bench/*.png, prints markdown

Tables give medians with min..max of the runs, and ratios of ferry to the
raw limits and to each baseline."""
import csv
import sys
from collections import defaultdict
from pathlib import Path

SYSTEMS = ["ferry", "ferry-run", "ferry-fuse", "nfs3", "nfs4", "9p", "smb", "sshfs", "sshfs-direct", "local"]
LABELS = {
    "ferry": "ferry (library)",
    "ferry-run": "ferry run (LD_PRELOAD)",
    "ferry-fuse": "ferry mount (FUSE)",
    "nfs3": "Ganesha + libnfs NFSv3",
    "nfs4": "Ganesha + libnfs NFSv4.0",
    "9p": "diod 9P2000.L",
    "smb": "Samba + libsmbclient",
    "sshfs": "sshfs (sshd)",
    "sshfs-direct": "sshfs directport (socat)",
    "local": "local tmpfs, no network",
}


COLOR = {s: f"C{i}" for i, s in enumerate(SYSTEMS)}


def load(d):
    rows = {}
    order = defaultdict(list)
    with open(Path(d) / "results.csv") as f:
        for r in csv.DictReader(f):
            key = (r["experiment"], r["system"], r["param"], r["metric"])
            r["median"] = float(r["median"])
            r["min"] = float(r["min"])
            r["max"] = float(r["max"])
            rows[key] = r
            if r["param"] not in order[(r["experiment"], r["metric"])]:
                order[(r["experiment"], r["metric"])].append(r["param"])
    return rows, order


def fmt(x):
    if x != x:
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(r):
    if r is None:
        return "–"
    if r["min"] == r["max"]:
        return fmt(r["median"])
    return f"{fmt(r['median'])} <sub>{fmt(r['min'])}–{fmt(r['max'])}</sub>"


def table(rows, order, exp, metric, title, unit, higher_better=True):
    params = order.get((exp, metric), [])
    if not params:
        return ""
    systems = [s for s in SYSTEMS if any((exp, s, p, metric) in rows for p in params)]
    out = [f"**{title}** ({unit}; median of the runs, min–max small)\n"]
    out.append("| system | " + " | ".join(params) + " |")
    out.append("|---" * (len(params) + 1) + "|")
    for s in systems:
        out.append(f"| {LABELS.get(s, s)} | " + " | ".join(cell(rows.get((exp, s, p, metric))) for p in params) + " |")
    # Ratios: ferry / each other system (>1: ferry better, for higher-is-better metrics).
    ferry = {p: rows.get((exp, "ferry", p, metric)) for p in params}
    others = [s for s in systems if s != "ferry"]
    if any(ferry.values()) and others and metric != "failed requests":
        out.append("")
        word = "ferry ÷ system" if higher_better else "system ÷ ferry"
        out.append(f"Ratio ({word}; > 1 means ferry is better):\n")
        out.append("| vs | " + " | ".join(params) + " |")
        out.append("|---" * (len(params) + 1) + "|")
        for s in others:
            cells = []
            for p in params:
                a, b = ferry[p], rows.get((exp, s, p, metric))
                if a is None or b is None or a["median"] == 0 or b["median"] == 0:
                    cells.append("–")
                else:
                    v = a["median"] / b["median"] if higher_better else b["median"] / a["median"]
                    cells.append(f"**{v:.2f}**" if v < 1 else f"{v:.2f}")
            out.append(f"| {LABELS.get(s, s)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def limits_table(rows, order):
    """Each system's figure as a fraction of the raw limit measured in the same run."""
    tcp = rows.get(("0", "raw", "TCP stream, 1 MiB writes", "throughput"))
    rtt = rows.get(("0", "raw", "TCP ping-pong 64 B, unpinned", "latency"))
    if not tcp or not rtt:
        return ""
    cols = [("1", "1M", "throughput", "read 1M ÷ raw TCP", tcp, False),
            ("1", "16M", "throughput", "read 16M ÷ raw TCP", tcp, False),
            ("2", "256M", "throughput", "write 256M ÷ raw TCP", tcp, False),
            ("2", "1G", "throughput", "write 1G ÷ raw TCP", tcp, False),
            ("4", "getattr on open file, median", "latency", "getattr ÷ raw ping-pong", rtt, True),
            ("4", "stat by path, median", "latency", "stat by path ÷ raw ping-pong", rtt, True)]
    out = ["| system | " + " | ".join(c[3] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for s in SYSTEMS:
        if s == "local":
            continue
        cells = []
        for e, p, m, _, lim, lat in cols:
            r = rows.get((e, s, p, m))
            if r is None:
                cells.append("–")
            elif lat:
                cells.append(f"{r['median'] / lim['median']:.2f} ×")
            else:
                cells.append(f"{100 * r['median'] / lim['median']:.0f} %")
        if any(c != "–" for c in cells):
            out.append(f"| {LABELS.get(s, s)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def raw_table(rows):
    out = ["| figure | median | min–max |", "|---|---|---|"]
    for (e, s, p, m), r in rows.items():
        if e == "0":
            out.append(f"| {s}: {p} ({r['unit']}) | {fmt(r['median'])} | {fmt(r['min'])}–{fmt(r['max'])} |")
    return "\n".join(out) + "\n"


def plots(rows, order, d):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(exp, metric, systems=SYSTEMS):
        params = order.get((exp, metric), [])
        for s in systems:
            pts = [(p, rows[(exp, s, p, metric)]) for p in params if (exp, s, p, metric) in rows]
            if pts:
                yield s, pts

    size = {"K": 1024, "M": 1024**2, "G": 1024**3}

    def bytes_of(p):
        return float(p[:-1]) * size[p[-1]] if p[-1] in size else float(p)

    raw_tcp = rows.get(("0", "raw", "TCP stream, 1 MiB writes", "throughput"))

    # 1. Throughput vs request size.
    fig, ax = plt.subplots(figsize=(8, 5))
    for s, pts in series("1", "throughput"):
        x = [bytes_of(p) for p, _ in pts]
        y = [r["median"] for _, r in pts]
        lo = [r["median"] - r["min"] for _, r in pts]
        hi = [r["max"] - r["median"] for _, r in pts]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=LABELS.get(s, s), color=COLOR[s],
                    linestyle="--" if s == "local" else "-")
    if raw_tcp:
        ax.axhline(raw_tcp["median"], color="grey", linestyle=":", label="raw TCP stream")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([4096, 8192, 65536, 2**20, 2**24], ["4K", "8K", "64K", "1M", "16M"])
    ax.set_xlabel("request size")
    ax.set_ylabel("MB/s (10^6 B/s)")
    ax.set_title("1. Sequential read throughput vs request size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(d) / "read-vs-request-size.png", dpi=110)

    # 2. Write vs file size.
    fig, ax = plt.subplots(figsize=(8, 5))
    for s, pts in series("2", "throughput"):
        ax.plot([bytes_of(p) for p, _ in pts], [r["median"] for _, r in pts], marker="o", color=COLOR[s],
                label=LABELS.get(s, s), linestyle="--" if s == "local" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([2**16, 2**20, 2**24, 2**28, 2**30], ["64K", "1M", "16M", "256M", "1G"])
    ax.set_xlabel("file size (written in 1 MiB calls, then fsync)")
    ax.set_ylabel("MB/s")
    ax.set_title("2. Write + fsync throughput vs file size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(d) / "write-vs-file-size.png", dpi=110)

    # 6. Throughput vs clients.
    fig, ax = plt.subplots(figsize=(8, 5))
    for s, pts in series("6", "aggregate throughput"):
        pts = [(p, r) for p, r in pts if p.isdigit()]
        ax.plot([int(p) for p, _ in pts], [r["median"] for _, r in pts], marker="o", color=COLOR[s],
                label=LABELS.get(s, s))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent client processes (64 KiB reads)")
    ax.set_ylabel("aggregate MB/s")
    ax.set_title("6. Aggregate read throughput vs number of clients")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(d) / "read-vs-clients.png", dpi=110)

    # 3. Window sweep.
    fig, ax = plt.subplots(figsize=(8, 5))
    tp = rows_for(rows, order, "3", "ferry", "throughput")
    cs = rows_for(rows, order, "3", "ferry", "client context switches")
    if tp:
        ax.plot([int(p) for p, _ in tp], [r["median"] for _, r in tp], marker="o", color="C0", label="throughput")
        ax.set_xlabel("window (requests in flight)")
        ax.set_ylabel("MB/s", color="C0")
        ax2 = ax.twinx()
        ax2.plot([int(p) for p, _ in cs], [r["median"] for _, r in cs], marker="s", color="C1",
                 label="client context switches / GiB")
        ax2.set_ylabel("client context switches per GiB", color="C1")
        ax2.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_title("3. ferry window sweep, 64 KiB sequential reads")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(Path(d) / "window-sweep.png", dpi=110)


def rows_for(rows, order, exp, system, metric):
    return [(p, rows[(exp, system, p, metric)]) for p in order.get((exp, metric), []) if (exp, system, p, metric) in rows]


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "docs/bench"
    rows, order = load(d)
    print("### Raw limits (same run)\n")
    print(raw_table(rows))
    print("### Against the raw limits\n")
    print(limits_table(rows, order))
    print(table(rows, order, "1", "throughput", "1. Sequential read vs request size", "MB/s"))
    print(table(rows, order, "2", "throughput", "2. Write + fsync vs file size", "MB/s"))
    print(table(rows, order, "3", "throughput", "3. Window sweep (ferry), throughput", "MB/s"))
    print(table(rows, order, "3", "client context switches", "3. Window sweep (ferry), client context switches", "per GiB", False))
    print(table(rows, order, "4", "latency", "4. stat latency", "µs", False))
    print(table(rows, order, "5", "rate", "5. Tree scan, 10,000 files of 1 KiB in 100 directories", "files/s"))
    print(table(rows, order, "6", "aggregate throughput", "6. Concurrent client processes, 64 KiB reads", "aggregate MB/s"))
    print(table(rows, order, "6", "failed requests", "6. Failed requests", "count", False))
    print(table(rows, order, "8", "client CPU", "8. Client CPU per GiB", "CPU s/GiB", False))
    print(table(rows, order, "8", "server CPU", "8. Server CPU per GiB", "CPU s/GiB", False))
    try:
        plots(rows, order, d)
    except ImportError:
        print("(matplotlib not installed: no plots)", file=sys.stderr)


if __name__ == "__main__":
    main()
