#!/usr/bin/env python3
"""Aggregate throughput of ferry gateways in front of one JuiceFS volume.

Sets up, all on 127.0.0.1 and under a temporary directory: a private
redis-server (JuiceFS's metadata, on a Unix socket), a JuiceFS volume with
local file storage mounted twice (two "gateway machines"), and a
`ferry serve` on each mount. Then N clients (2 and 4) each read, and each
write (+ fsync), a file of their own, at the same time:

- direct:      `dd` on the JuiceFS mounts (what a user would do without
               ferry; clients alternate between the two mounts),
- 1 gateway:   `ferry run -- dd` through the first gateway only,
- 2 gateways:  `ferry run -- dd` through both (clients alternate).

Each figure is the aggregate MB/s (all clients' bytes over the wall time of
the slowest), the median of --runs runs, the order of the systems rotated
between runs; beside them the raw loopback TCP rate measured in the same run
(`ferry compare --only 0`: one stream, 1 MiB writes). Everything shares this
machine's cores: the figures are bounded by the CPU, not by the network or
the gateways' number (see docs/benchmarks.md for how they would scale).

Usage: bench/gateways.py [--ferry target/release/ferry] [--size-mib 256]
       [--runs 3] [--clients 2,4] [--juicefs juicefs]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def wait_for(pred, secs, what):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    sys.exit(f"gateways.py: {what} did not happen within {secs} s")


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(l.split()[4] == path for l in f)


def loopback_mbs(ferry):
    """The raw TCP stream rate over 127.0.0.1 (1 MiB writes), as `ferry
    compare` measures it: the limit the figures are stated against."""
    out = subprocess.run([ferry, "compare", "--only", "0", "--runs", "1"], capture_output=True, text=True,
                         timeout=300).stdout
    for line in out.splitlines():
        if "TCP stream, 1 MiB writes" in line:
            return float(line.split()[-2])
    sys.exit(f"gateways.py: no raw TCP figure from ferry compare:\n{out}")


class Setup:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="ferry-gwbench-")
        self.procs = []
        self.mounts = []
        sock = os.path.join(self.dir, "redis.sock")
        self.spawn(["redis-server", "--port", "0", "--save", "", "--appendonly", "no", "--unixsocket", sock])
        wait_for(lambda: os.path.exists(sock), 10, "redis-server start")
        self.meta = f"unix://{sock}?db=1"
        subprocess.run([args.juicefs, "format", "--storage", "file", "--bucket",
                        os.path.join(self.dir, "bucket") + "/", self.meta, "gwbench"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.nodes = []
        for i in range(2):
            mp = os.path.join(self.dir, f"node{i}")
            os.mkdir(mp)
            self.spawn([args.juicefs, "mount", self.meta, mp, "--no-usage-report",
                        "--cache-dir", os.path.join(self.dir, f"cache{i}")])
            wait_for(lambda: mounted(mp), 30, f"juicefs mount {i}")
            self.mounts.append(mp)
            self.nodes.append(mp)
        self.token = os.path.join(self.dir, "token")
        self.ports = []
        for i, mp in enumerate(self.nodes):
            env = dict(os.environ, XDG_STATE_HOME=os.path.join(self.dir, f"state{i}"))
            p = self.spawn([args.ferry, "serve", mp, "--listen", "127.0.0.1:0", "--no-root-squash", "--token-file", self.token],
                           stdout=subprocess.PIPE, env=env)
            line = p.stdout.readline().decode()
            self.ports.append(int(line.strip().rsplit(":", 1)[1]))

    def spawn(self, cmd, **kw):
        kw.setdefault("stdout", subprocess.DEVNULL)
        p = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def close(self):
        for mp in self.mounts:
            subprocess.run(["umount", mp], stderr=subprocess.DEVNULL)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for mp in self.mounts:
            if mounted(mp):
                subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_clients(cmds):
    """Runs the commands at once; seconds until the last one ended."""
    start = time.monotonic()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=e) for c, e in cmds]
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            sys.exit(f"gateways.py: a client failed: {err.decode().strip()}")
    return time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ferry", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "ferry"))
    ap.add_argument("--juicefs", default=shutil.which("juicefs") or "juicefs")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", default="2,4")
    args = ap.parse_args()
    args.ferry = os.path.abspath(args.ferry)
    counts = [int(c) for c in args.clients.split(",")]
    size = args.size_mib << 20
    s = Setup(args)
    try:
        env = dict(os.environ, FERRY_TOKEN_FILE=s.token, FERRY_SAME_HOST="0")
        env.pop("FERRY_MOUNTS", None)
        src = os.path.join("/dev/shm", f"ferry-gwbench-{os.getpid()}")
        with open(src, "wb") as f:
            f.write(os.urandom(size))
        top = max(counts)
        for i in range(top):
            shutil.copyfile(src, os.path.join(s.nodes[0], f"r{i}"))
        gw = [f"127.0.0.1:{p}" for p in s.ports]
        dd = ["dd", "bs=1M", "status=none"]

        def through(addrs, i, argv):
            url = f"ferry://{addrs[i % len(addrs)]}/"
            return ([args.ferry, "run", "--mount", f"/remote={url}", "--"] + argv, env)

        def command(system, op, i):
            if system == "direct":
                base = s.nodes[i % 2]
            else:
                base = "/remote"
            path = os.path.join(base, f"r{i}" if op == "read" else f"w{i}")
            argv = dd + ([f"if={path}", "of=/dev/null"] if op == "read" else [f"if={src}", f"of={path}", "conv=fsync"])
            if system == "direct":
                return (argv, env)
            return through(gw[:1] if system == "1 gateway" else gw, i, argv)

        systems = ["direct", "1 gateway", "2 gateways"]
        results = {}
        loop = []
        for r in range(args.runs):
            loop.append(loopback_mbs(args.ferry))
            order = systems[r % 3:] + systems[:r % 3]
            for n in counts:
                for op in ["read", "write"]:
                    for system in order:
                        secs = run_clients([command(system, op, i) for i in range(n)])
                        results.setdefault((n, op, system), []).append(n * size / secs / 1e6)
        os.remove(src)
        raw = statistics.median(loop)
        print(f"JuiceFS volume mounted twice, a ferry gateway on each; {args.size_mib} MiB per client, "
              f"median of {args.runs} runs, system order rotated")
        print(f"raw loopback (one TCP stream, 1 MiB writes, same run): {raw:,.0f} MB/s; cores: {os.cpu_count()}")
        print(f"{'clients':>7} {'op':>6} " + " ".join(f"{x:>12}" for x in systems) + "   ratios to direct / to loopback")
        for n in counts:
            for op in ["read", "write"]:
                figs = [statistics.median(results[(n, op, x)]) for x in systems]
                ratios = " ".join(f"{f / figs[0]:.2f}/{f / raw:.2f}" for f in figs[1:])
                print(f"{n:>7} {op:>6} " + " ".join(f"{f:>12,.0f}" for f in figs) + f"   {ratios}")
    finally:
        s.close()


if __name__ == "__main__":
    main()
