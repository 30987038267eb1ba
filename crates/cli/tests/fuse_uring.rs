//! The mount's FUSE transport (issue 34): FUSE over io_uring where the
//! kernel offers it (the `fuse` module's `enable_uring`), `/dev/fuse` reads
//! where it does not. Real programs run through each, their bytes checked,
//! and the mount's metrics say which transport carried the requests.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::scrape::{get, sample};
use common::{random_bytes, Server};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The switch is the machine's: the tests here take turns with it.
static SWITCH: Mutex<()> = Mutex::new(());

/// Sets `enable_uring`, and puts back what it found when dropped — also
/// when the test fails.
struct EnableUring(String);

impl EnableUring {
    fn set(on: bool) -> EnableUring {
        let old = fs::read_to_string(ENABLE_URING)
            .unwrap_or_else(|e| panic!("{ENABLE_URING}: {e} (this kernel kind has CONFIG_FUSE_IO_URING)"));
        fs::write(ENABLE_URING, if on { "Y" } else { "N" }).unwrap_or_else(|e| panic!("{ENABLE_URING}: {e}"));
        EnableUring(old.trim().to_string())
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = fs::write(ENABLE_URING, &self.0);
    }
}

/// A foreground `ferry mount` with metrics, its stderr kept in a file.
struct Mount {
    child: std::process::Child,
    metrics: String,
    stderr: std::path::PathBuf,
}

impl Mount {
    fn start(srv: &Server, mp: &Path, dir: &Path, env: &[(&str, &str)]) -> Mount {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let metrics = format!("127.0.0.1:{port}");
        let stderr = dir.join("mount.err");
        let child = Command::new(common::FERRY)
            .arg("mount")
            .arg(srv.url("/"))
            .arg(mp)
            .args(["--metrics", &metrics])
            // The daemon moves the data (on the server's host it would
            // hand files to the kernel instead, past either transport).
            .env("FERRY_SAME_HOST", "0")
            .envs(env.iter().copied())
            .env("FERRY_TOKEN_FILE", &srv.token_file)
            .env_remove("FERRY_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn ferry mount");
        let m = Mount { child, metrics, stderr };
        assert!(
            common::fuse::wait_for(Duration::from_secs(20), || common::fuse::is_live(mp)),
            "mount did not come up: {}",
            m.said()
        );
        m
    }

    fn said(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// (requests over the ring, requests read from /dev/fuse, ring on).
    fn counts(&self) -> (f64, f64, f64) {
        let (ring, dev, on, _) = self.counts_lent();
        (ring, dev, on)
    }

    /// `counts`, and the read replies written in the ring's payload.
    fn counts_lent(&self) -> (f64, f64, f64, f64) {
        let (status, m) = get(&self.metrics, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "{m}");
        (
            sample(&m, "ferry_fuse_ring_requests_total"),
            sample(&m, "ferry_fuse_dev_requests_total"),
            sample(&m, "ferry_fuse_ring_on"),
            sample(&m, "ferry_fuse_ring_lent_replies_total"),
        )
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(script: &str, dir: &Path) {
    let o = Command::new("timeout")
        .args(["120", "bash", "-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .output()
        .expect("run bash");
    assert!(
        o.status.success(),
        "{script}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// cp, tar, python3 and a large dd through the mount at `mp`, each result
/// compared with a local copy (`work`) and with the export (`export`).
fn programs(mp: &Path, work: &Path, export: &Path) {
    fs::write(work.join("blob"), random_bytes(5 << 20, 34)).unwrap();
    let tree = work.join("tree");
    for d in 0..4 {
        fs::create_dir_all(tree.join(format!("d{d}"))).unwrap();
        for f in 0..25 {
            fs::write(tree.join(format!("d{d}/f{f}")), random_bytes(1000 + 997 * f, (d * 100 + f) as u64)).unwrap();
        }
    }
    let script = format!(
        r#"
W={work}; M={mp}; E={export}
cp "$W/blob" "$M/blob"
cmp "$W/blob" "$M/blob"
cmp "$W/blob" "$E/blob"
tar -C "$W" -cf "$M/tree.tar" tree
mkdir "$M/x"
tar -C "$M/x" -xf "$M/tree.tar"
diff -r "$W/tree" "$M/x/tree"
diff -r "$W/tree" "$E/x/tree"
python3 - "$M/py" <<'EOF'
import hashlib, os, sys
p = sys.argv[1]
data = os.urandom(3 * 1024 * 1024 + 12345)
with open(p, "wb") as f:
    for i in range(0, len(data), 65536):
        f.write(data[i:i + 65536])
with open(p, "rb") as f:
    back = f.read()
assert back == data, "python3 read back other bytes"
# Reads of every shape into the ring entry's payload: larger than one
# request (the kernel splits it), across the end of the file (short), at
# and past it (empty), unaligned, and through the page cache (mmap).
with open(p, "rb") as f:
    fd, n = f.fileno(), len(data)
    assert os.pread(fd, 5 << 20, 0) == data, "a read past one request and the end"
    assert os.pread(fd, 100, n - 10) == data[-10:], "a read across the end"
    assert os.pread(fd, 100, n) == b"", "a read at the end"
    assert os.pread(fd, 100, n + 4096) == b"", "a read past the end"
    assert os.pread(fd, 70001, 12345) == data[12345:82346], "an unaligned read"
    import mmap
    with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
        assert m[:] == data, "page-cache reads (mmap)"
with open(p, "r+b") as f:
    f.seek(1000)
    f.write(b"ferry")
    f.seek(998)
    assert f.read(9) == data[998:1000] + b"ferry" + data[1005:1007]
EOF
dd if=/dev/urandom of="$W/big" bs=1M count=192 status=none
dd if="$W/big" of="$M/big" bs=1M status=none
dd if="$M/big" of="$W/big.back" bs=1M status=none
cmp "$W/big" "$W/big.back"
cmp "$W/big" "$E/big"
"#,
        work = work.display(),
        mp = mp.display(),
        export = export.display()
    );
    sh(&script, work);
}

#[test]
fn the_mount_serves_requests_over_io_uring_when_the_kernel_offers_it() {
    common::fuse::require_fuse();
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let srv = Server::start(&[]);
    let tmp = common::TempDir::new("fuse-uring");
    let (mp, work) = (tmp.path().join("mp"), tmp.path().join("work"));
    fs::create_dir(&mp).unwrap();
    fs::create_dir(&work).unwrap();
    let _detach = common::fuse::Detach(mp.clone());
    let m = {
        // On only while the mount starts: the kernel offers the rings in
        // INIT, and a mount keeps them.
        let _on = EnableUring::set(true);
        Mount::start(&srv, &mp, tmp.path(), &[])
    };
    let (ring0, dev0, on) = m.counts();
    assert_eq!(on, 1.0, "the rings are not on: {}", m.said());
    programs(&mp, &work, srv.export.path());
    let (ring, dev, _, lent) = m.counts_lent();
    // 192 MiB written and read in 1 MiB requests, and the rest.
    assert!(ring - ring0 > 400.0, "requests over the ring: {ring0} → {ring}");
    // Each read's data received straight into its entry's payload (the
    // 192 MiB `dd` alone is 192 reads), none copied there.
    assert!(lent > 192.0, "read replies written in place in the ring: {lent}");
    assert_eq!(dev - dev0, 0.0, "requests still read from /dev/fuse: {dev0} → {dev} (ring {ring})");
    assert_eq!(dev, 0.0, "no request after INIT came by /dev/fuse: {dev}");
    drop(m);
    assert!(common::fuse::wait_for(Duration::from_secs(10), || !common::fuse::is_mounted(&mp)), "still mounted");
}

#[test]
fn the_mount_falls_back_to_dev_fuse_reads_where_the_kernel_offers_no_rings() {
    common::fuse::require_fuse();
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let srv = Server::start(&[]);
    let tmp = common::TempDir::new("fuse-uring-off");
    let (mp, work) = (tmp.path().join("mp"), tmp.path().join("work"));
    fs::create_dir(&mp).unwrap();
    fs::create_dir(&work).unwrap();
    let _detach = common::fuse::Detach(mp.clone());
    let m = {
        let _off = EnableUring::set(false);
        Mount::start(&srv, &mp, tmp.path(), &[])
    };
    let said = m.said();
    assert!(said.contains("/dev/fuse reads (the kernel does not offer FUSE over io_uring"), "said: {said}");
    assert_eq!(said.matches("io_uring").count(), 1, "said once: {said}");
    programs(&mp, &work, srv.export.path());
    let (ring, dev, on, lent) = m.counts_lent();
    assert_eq!((ring, on, lent), (0.0, 0.0, 0.0), "no rings");
    assert!(dev > 400.0, "requests read from /dev/fuse: {dev}");
    drop(m);

    // Offered, but not wanted (FERRY_FUSE_URING=0): /dev/fuse too.
    let mp2 = tmp.path().join("mp2");
    fs::create_dir(&mp2).unwrap();
    let _detach2 = common::fuse::Detach(mp2.clone());
    let m = {
        let _on = EnableUring::set(true);
        Mount::start(&srv, &mp2, tmp.path(), &[("FERRY_FUSE_URING", "0")])
    };
    fs::write(mp2.join("small"), b"ferry").unwrap();
    assert_eq!(fs::read(mp2.join("small")).unwrap(), b"ferry");
    let (ring, dev, on) = m.counts();
    assert_eq!((ring, on), (0.0, 0.0), "rings despite FERRY_FUSE_URING=0");
    assert!(dev > 0.0);
}

/// `ferry bench --fuse` measures both transports in one run and puts the
/// switch back as it found it.
#[test]
fn the_fuse_benchmark_compares_io_uring_with_dev_fuse() {
    common::fuse::require_fuse();
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let before = fs::read_to_string(ENABLE_URING).unwrap();
    let o = Command::new("timeout")
        .args(["300", common::FERRY, "bench", "--fuse", "--quick", "--runs", "1"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("FUSE transport of the mounts not marked /dev/fuse: FUSE over io_uring: "), "{out}");
    for row in ["null FUSE read, /dev/fuse", "ferry mount read, /dev/fuse", "ferry mount write, /dev/fuse"] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row}: {out}"));
        assert!(line.contains("io_uring is "), "{line}");
    }
    assert!(out.contains("client CPU, mount read"), "{out}");
    assert!(out.contains("target: ferry mount read >= 0.8 x the library's"), "{out}");
    // What bounds the mount's read, measured in the same run: null FUSE's
    // CPU on both transports, a receive with no copy, the server's part.
    for row in [
        "client CPU, null FUSE read ",
        "client CPU, null FUSE read, /dev/fuse",
        "TCP receive, spliced (no copy)",
        "server CPU, library read",
    ] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row}: {out}"));
        let figure: f64 = line[row.len()..].split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(-1.0);
        assert!(figure > 0.0, "{line}");
    }
    assert!(out.contains("bound: a mount read costs the reader's CPU at least "), "{out}");
    assert_eq!(fs::read_to_string(ENABLE_URING).unwrap(), before, "enable_uring not put back");
}
