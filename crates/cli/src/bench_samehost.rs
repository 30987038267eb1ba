//! `ferry bench --same-host`: `dd` of one file on the server's own host —
//! read, and written with `conv=fsync` — through `ferry mount` (whose nodes
//! the server's descriptors back: FUSE passthrough) and under `ferry run`
//! (handed the server's descriptor at open), each beside the same over TCP
//! (`FERRY_SAME_HOST=0`) and a local `dd` of the export's file, in one run;
//! figures as ratios to the local `dd`, paired run by run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{exe, mbps, progress, start_server, Series};

/// A `ferry mount` daemon this benchmark started: killed by PID, and its
/// mount point detached, when dropped.
struct Mount {
    child: Child,
    mp: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mount(&self.mp) {
            let _ = rustix::mount::unmount(&self.mp, rustix::mount::UnmountFlags::DETACH);
        }
        let _ = std::fs::remove_dir(&self.mp);
    }
}

fn is_mount(mp: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(mp), mp.parent().map(std::fs::metadata)) {
        (Ok(m), Some(Ok(p))) => m.dev() != p.dev(),
        (Err(e), _) => e.raw_os_error() == Some(libc::ENOTCONN),
        _ => false,
    }
}

fn mount(port: u16, mp: &Path, same_host: bool) -> Result<Mount, String> {
    std::fs::create_dir_all(mp).map_err(|e| format!("{}: {e}", mp.display()))?;
    let child = Command::new(exe()?)
        .args(["mount", &format!("ferry://127.0.0.1:{port}/")])
        .arg(mp)
        .env("FERRY_TOKEN", "unused")
        .env("FERRY_SAME_HOST", if same_host { "1" } else { "0" })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start ferry mount: {e}"))?;
    let m = Mount { child, mp: mp.to_path_buf() };
    let end = Instant::now() + Duration::from_secs(20);
    while !is_mount(mp) {
        if Instant::now() > end {
            return Err(format!("{}: the mount did not come up", mp.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(m)
}

/// One `dd` (under `ferry run` with `run`: `Some(same_host)`): MB/s.
fn dd(port: u16, run: Option<bool>, args: &[String], bytes: u64) -> Result<f64, String> {
    let mut cmd = match run {
        Some(same_host) => {
            let mut c = Command::new(exe()?);
            c.args(["run", "--mount", &format!("/remote=ferry://127.0.0.1:{port}/"), "--", "dd"])
                .env("FERRY_TOKEN", "unused")
                .env("FERRY_SAME_HOST", if same_host { "1" } else { "0" });
            c
        }
        None => Command::new("dd"),
    };
    let t = Instant::now();
    let o = cmd.args(args).stdout(Stdio::null()).output().map_err(|e| format!("cannot start dd: {e}"))?;
    let elapsed = t.elapsed();
    if !o.status.success() {
        return Err(format!("dd {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(mbps(bytes, elapsed))
}

/// A place `dd` reads and writes through: its name, its path for the
/// file's name, and whether it runs under `ferry run` (same host or not).
struct Way {
    at: Box<dyn Fn(&str) -> String>,
    run: Option<bool>,
    read: Series,
    write: Series,
}

pub fn run(runs: usize, bytes: u64, quick: bool, dir: &Path) -> Result<(), String> {
    let mib = bytes >> 20;
    let data = dir.join("same-host.dat");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        let block = vec![0x5au8; 1 << 20];
        for _ in 0..mib {
            f.write_all(&block).map_err(|e| e.to_string())?;
        }
    }
    let (_server, port) = start_server(dir)?;
    let mnt = std::env::temp_dir().join(format!("ferry-bench-same-host-{}", std::process::id()));
    let fuse = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok()
        && rustix::process::geteuid().is_root();
    let mounts = if fuse {
        Some((mount(port, &mnt.join("same"), true)?, mount(port, &mnt.join("tcp"), false)?))
    } else {
        println!("ferry bench --same-host: mount skipped: FUSE needs /dev/fuse and root");
        None
    };
    let export = dir.to_string_lossy().into_owned();
    let path = |root: String| -> Box<dyn Fn(&str) -> String> { Box::new(move |name| format!("{root}/{name}")) };
    let way = |name, at, run| Way { at, run, read: Series::new(name, "MB/s"), write: Series::new(name, "MB/s") };
    let mut ways = vec![way("local dd of the export's file", path(export), None)];
    if let Some((same, tcp)) = &mounts {
        ways.push(way("ferry mount, same host (passthrough)", path(same.mp.to_string_lossy().into()), None));
        ways.push(way("ferry mount over TCP", path(tcp.mp.to_string_lossy().into()), None));
    }
    ways.push(way("ferry run, same host (descriptor)", path("/remote".into()), Some(true)));
    ways.push(way("ferry run over TCP", path("/remote".into()), Some(false)));
    for r in 0..runs {
        progress("same host: dd through the mount and ferry run, and locally", r, runs);
        for w in &mut ways {
            let read = vec![format!("if={}", (w.at)("same-host.dat")), "of=/dev/null".into(), "bs=1M".into()];
            w.read.values.push(dd(port, w.run, &read, mib << 20)?);
            let out = (w.at)("same-host-w.dat");
            let write = vec![
                "if=/dev/zero".into(),
                format!("of={out}"),
                "bs=1M".into(),
                format!("count={mib}"),
                "conv=fsync".into(),
            ];
            w.write.values.push(dd(port, w.run, &write, mib << 20)?);
        }
    }
    drop(mounts);
    let _ = std::fs::remove_dir_all(&mnt);
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(dir.join("same-host-w.dat"));
    if quick {
        println!("{}", super::QUICK_NOTE);
    }
    println!("ferry bench --same-host: dd of a {mib} MiB file, 1 MiB blocks (writes conv=fsync), {runs} runs; medians (min..max)");
    let paired = |a: &[f64], b: &[f64]| {
        let mut r = Series::new("ratio", "");
        r.values = a.iter().zip(b).map(|(x, y)| x / y).collect();
        r.median()
    };
    for (title, write) in [("read", false), ("write + fsync", true)] {
        println!("{:<40} {:>10} {:>22} {:>14}", title, "median", "min..max", "x local dd");
        let pick = |w: &Way| if write { w.write.values.clone() } else { w.read.values.clone() };
        let local = pick(&ways[0]);
        for w in &ways {
            let s = if write { &w.write } else { &w.read };
            let ratio = paired(&s.values, &local);
            println!(
                "{:<40} {:>7.0} {:<4} {:>10.0}..{:<10.0} {:>8.2}",
                s.name,
                s.median(),
                s.unit,
                s.min(),
                s.max(),
                ratio
            );
        }
    }
    Ok(())
}
