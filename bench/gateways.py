#!/usr/bin/env python3
"""Aggregate throughput of ferry gateways in front of one shared volume.

Sets up, all on 127.0.0.1 and under a temporary directory, a volume mounted
twice (two "gateway machines") and a `ferry serve` on each mount:

- --fs juicefs (the default): a private redis-server (JuiceFS's metadata,
  on a Unix socket), a JuiceFS volume with local file storage;
- --fs glusterfs: a private `glusterd -N` (its own directories; the
  management port is GlusterFS's fixed 24007), a replica-2 volume of two
  bricks named by this machine's host name (which must resolve to a
  loopback address), mounted with `mount -t glusterfs`.
 Then N clients (2 and 4) each read, and each
write (+ fsync), a file of their own, at the same time:

- direct:      `dd` on the JuiceFS mounts (what a user would do without
               ferry; clients alternate between the two mounts),
- 1 gateway:   `ferry run -- dd` through the first gateway only,
- 2 gateways:  `ferry run -- dd` through both (clients alternate),
- 1 gw, no fence: through a third gateway on the first mount, started with
               `--disable-caps fence` (the fence's cost, in the same run).

Each figure is the aggregate MB/s (all clients' bytes over the wall time of
the slowest), the median of --runs runs, the order of the systems rotated
between runs; beside them the raw loopback TCP rate measured in the same run
(`ferry compare --only 0`: one stream, 1 MiB writes). Everything shares this
machine's cores: the figures are bounded by the CPU, not by the network or
the gateways' number (see docs/benchmarks.md for how they would scale).

Then, --runs times: a program under `ferry run` with both gateways in its
URL writes 1 MiB and fsyncs, round after round, and its gateway is stopped
(SIGSTOP, found by its TCP connection) after round 5: printed is how long
after the stop its next round ended (through the other gateway, once the
client gave the stopped one up after FERRY_GATEWAY_TIMEOUT, 5 s by default).
Last, what reading a fence record through a mount costs (a gateway thread
serving a client that may move has its record read at most every 0.1 s).

Usage: bench/gateways.py [--fs juicefs|glusterfs] [--ferry target/release/ferry]
       [--size-mib 256] [--runs 3] [--clients 2,4] [--juicefs juicefs]
"""

import argparse
import os
import shutil
import signal
import socket
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
        self.nodes = []
        self.serves = []
        self.gluster = None
        try:
            if args.fs == "glusterfs":
                self.glusterfs()
            else:
                self.juicefs()
            self.gateways()
        except BaseException:
            self.close()
            raise

    def juicefs(self):
        args = self.args
        sock = os.path.join(self.dir, "redis.sock")
        self.spawn(["redis-server", "--port", "0", "--save", "", "--appendonly", "no", "--unixsocket", sock])
        wait_for(lambda: os.path.exists(sock), 10, "redis-server start")
        self.meta = f"unix://{sock}?db=1"
        subprocess.run([args.juicefs, "format", "--storage", "file", "--bucket",
                        os.path.join(self.dir, "bucket") + "/", self.meta, "gwbench"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(2):
            mp = os.path.join(self.dir, f"node{i}")
            os.mkdir(mp)
            self.spawn([args.juicefs, "mount", self.meta, mp, "--no-usage-report",
                        "--cache-dir", os.path.join(self.dir, f"cache{i}")])
            wait_for(lambda: mounted(mp), 30, f"juicefs mount {i}")
            self.mounts.append(mp)
            self.nodes.append(mp)

    def gluster_cli(self, *argv, check=True):
        cmd = ["timeout", "60", "gluster", "--mode=script", f"--glusterd-sock={self.dir}/glusterd.sock", *argv]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if check and r.returncode != 0:
            sys.exit(f"gateways.py: gluster {' '.join(argv)}: {r.stdout}{r.stderr}")
        return r

    def glusterfs(self):
        host = socket.gethostname()
        if not any(a[4][0].startswith("127.") or a[4][0] == "::1" for a in socket.getaddrinfo(host, None)):
            sys.exit(f"gateways.py: GlusterFS bricks need a host name; {host} does not resolve to a loopback address")
        for sub in ["wd", "run", "log", "brick0", "brick1"]:
            os.mkdir(os.path.join(self.dir, sub))
        vol = os.path.join(self.dir, "glusterd.vol")
        with open(vol, "w") as f:
            f.write(f"volume management\n    type mgmt/glusterd\n    option working-directory {self.dir}/wd\n"
                    f"    option run-directory {self.dir}/run\n    option glusterd-sockfile {self.dir}/glusterd.sock\n"
                    "    option transport-type socket\n    option transport.socket.listen-port 24007\n"
                    "    option ping-timeout 0\n    option event-threads 1\nend-volume\n")
        self.spawn(["glusterd", "-N", "--log-level", "WARNING", "-f", vol, "-l", f"{self.dir}/log/glusterd.log"])
        wait_for(lambda: self.gluster_cli("pool", "list", check=False).returncode == 0, 30, "glusterd start")
        name = f"gwbench{os.getpid()}"
        self.gluster_cli("volume", "create", name, "replica", "2", f"{host}:{self.dir}/brick0",
                         f"{host}:{self.dir}/brick1", "force")
        self.gluster = name
        self.gluster_cli("volume", "start", name)
        for i in range(2):
            mp = os.path.join(self.dir, f"node{i}")
            os.mkdir(mp)
            subprocess.run(["timeout", "60", "mount", "-t", "glusterfs", "-o", f"log-file={self.dir}/log/node{i}.log",
                            f"{host}:/{name}", mp], check=True)
            wait_for(lambda: mounted(mp), 30, f"gluster mount {i}")
            self.mounts.append(mp)
            self.nodes.append(mp)

    def gateways(self):
        args = self.args
        self.token = os.path.join(self.dir, "token")
        self.ports = []
        # The third: a gateway on the first mount that fences no session,
        # for the fence's cost in the same run.
        for i, (mp, extra) in enumerate([(self.nodes[0], []), (self.nodes[1], []),
                                         (self.nodes[0], ["--disable-caps", "fence"])]):
            env = dict(os.environ, XDG_STATE_HOME=os.path.join(self.dir, f"state{i}"))
            p = subprocess.Popen([args.ferry, "serve", mp, "--listen", "127.0.0.1:0", "--no-root-squash",
                                  "--token-file", self.token] + extra,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            self.serves.append(p)
            line = p.stdout.readline().decode()
            self.ports.append(int(line.strip().rsplit(":", 1)[1]))

    def spawn(self, cmd, **kw):
        kw.setdefault("stdout", subprocess.DEVNULL)
        p = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def close(self):
        # The gateways first: a mount they hold open would not unmount.
        for p in reversed(self.serves):
            stop(p)
        for mp in self.mounts:
            subprocess.run(["umount", mp], stderr=subprocess.DEVNULL)
        if self.gluster:
            run = os.path.join(self.dir, "run")
            pidfiles = [os.path.join(d, f) for d in (f"{run}/vols/{self.gluster}", f"{run}/shd/{self.gluster}")
                        if os.path.isdir(d) for f in os.listdir(d) if f.endswith(".pid")]
            # Stopping the volume ends its brick and self-heal processes.
            self.gluster_cli("volume", "stop", self.gluster, "force", check=False)
            self.gluster_cli("volume", "delete", self.gluster, check=False)
            for f in pidfiles:
                try:
                    pid = int(open(f).read().strip())
                    if self.dir in open(f"/proc/{pid}/cmdline").read():
                        os.kill(pid, 9)
                except (OSError, ValueError):
                    pass
        for p in reversed(self.procs):
            stop(p)
        for mp in self.mounts:
            if mounted(mp):
                subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def peers_on(ports):
    """The gateway ports (of `ports`) that an established TCP connection on
    this machine goes to (its client side)."""
    used = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            port = int(fields[2].split(":")[1], 16)
            if fields[3] == "01" and port in ports:
                used.add(port)
    return used


STOP_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
block = os.urandom(1 << 20)
for r in range(int(sys.argv[2])):
    os.pwrite(fd, block, (r % 8) << 20)
    os.fsync(fd)
    print(r, time.monotonic(), flush=True)
    time.sleep(0.05)
os.close(fd)
"""


def stopped_gateway_move(s, env, args):
    """A program under `ferry run` (both gateways in its URL) writes 1 MiB
    and fsyncs, round after round; after round 5 its gateway is stopped
    (SIGSTOP). Returns the seconds from the stop to the end of its next
    round (the move to the other gateway within it), and continues the
    stopped gateway."""
    url = "ferry://" + ",".join(f"127.0.0.1:{p}" for p in s.ports[:2]) + "/"
    cmd = [args.ferry, "run", "--mount", f"/remote={url}", "--", "python3", "-c", STOP_WRITER, "/remote/stopped", "40"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(6):
            p.stdout.readline()
        used = peers_on(set(s.ports[:2]))
        if len(used) != 1:
            sys.exit(f"gateways.py: the writer's gateway is not one of {s.ports[:2]}: {used}")
        gw = s.serves[s.ports.index(used.pop())]
        os.kill(gw.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        line = p.stdout.readline()
        took = float(line.split()[1]) - t0 if line else float("inf")
        p.stdout.read()
        p.wait(timeout=120)
        if p.returncode != 0 or not line:
            sys.exit(f"gateways.py: the writer failed across the stop: {p.stderr.read()}")
        return took
    finally:
        if p.poll() is None:
            p.kill()
        for g in s.serves[:2]:
            os.kill(g.pid, signal.SIGCONT)


def record_read_us(s):
    """Microseconds to read a fence record through a gateway's mount (open,
    read, close, as a gateway does per session at most every 0.1 s), median of
    200; the records are those the moves above raised."""
    d = os.path.join(s.nodes[0], ".ferry-fence")
    recs = [f for f in os.listdir(d) if not f.startswith(".")]
    if not recs:
        sys.exit(f"gateways.py: no fence record in {d} after the moves")
    path = os.path.join(d, recs[0])
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        with open(path) as f:
            f.read()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


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
    ap.add_argument("--fs", choices=["juicefs", "glusterfs"], default="juicefs")
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
        gw = [f"127.0.0.1:{p}" for p in s.ports[:2]]
        unfenced = f"127.0.0.1:{s.ports[2]}"
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
            if system == "1 gw, no fence":
                return through([unfenced], i, argv)
            return through(gw[:1] if system == "1 gateway" else gw, i, argv)

        systems = ["direct", "1 gateway", "2 gateways", "1 gw, no fence"]
        results = {}
        loop = []
        for r in range(args.runs):
            loop.append(loopback_mbs(args.ferry))
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for n in counts:
                for op in ["read", "write"]:
                    for system in order:
                        secs = run_clients([command(system, op, i) for i in range(n)])
                        results.setdefault((n, op, system), []).append(n * size / secs / 1e6)
        moves = [stopped_gateway_move(s, env, args) for _ in range(args.runs)]
        record_us = record_read_us(s)
        os.remove(src)
        raw = statistics.median(loop)
        fs = "JuiceFS volume (local file storage)" if args.fs == "juicefs" else "GlusterFS replica-2 volume"
        print(f"{fs} mounted twice, a ferry gateway on each; {args.size_mib} MiB per client, "
              f"median of {args.runs} runs, system order rotated")
        print(f"raw loopback (one TCP stream, 1 MiB writes, same run): {raw:,.0f} MB/s; cores: {os.cpu_count()}")
        print(f"{'clients':>7} {'op':>6} " + " ".join(f"{x:>14}" for x in systems)
              + "   ratios to direct / to loopback; fenced / not, one gateway")
        for n in counts:
            for op in ["read", "write"]:
                figs = [statistics.median(results[(n, op, x)]) for x in systems]
                ratios = " ".join(f"{f / figs[0]:.2f}/{f / raw:.2f}" for f in figs[1:3])
                print(f"{n:>7} {op:>6} " + " ".join(f"{f:>14,.0f}" for f in figs) + f"   {ratios}; {figs[1] / figs[3]:.2f}")
        bound = env.get("FERRY_GATEWAY_TIMEOUT", "5")
        print(f"a writer's gateway stopped (SIGSTOP): its next 1 MiB write + fsync ended {statistics.median(moves):.2f} s "
              f"after the stop, through the other gateway (median of {len(moves)}: "
              + ", ".join(f"{m:.2f}" for m in moves) + f"; bound FERRY_GATEWAY_TIMEOUT={bound} s)")
        print(f"fence record read through a gateway's mount (open, read, close): {record_us:.0f} us, median of 200; "
              f"a gateway reads it per session that may move at most every 0.1 s "
              f"({record_us / 1e5 * 100:.3f} % of one thread's time)")
    finally:
        s.close()


if __name__ == "__main__":
    main()
