//! A GlusterFS replica-2 volume mounted twice, as on two gateway machines:
//! a private `glusterd -N` (its own working, run and log directories, its
//! own CLI socket; the management port is GlusterFS's fixed 24007, so the
//! tests of one process take turns), two bricks under a temp directory
//! named by this machine's host name (GlusterFS refuses bricks on
//! `127.0.0.1`; the host name must resolve to a loopback address), both
//! mounts with `mount -t glusterfs`. Everything is torn down on drop, also
//! when the test fails: unmounted, the volume stopped and deleted (which
//! ends its brick and self-heal processes), `glusterd` killed by its PID.
//! `test.sh` installs `glusterfs-server` and `glusterfs-client` (apt).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::fuse::wait_for;
use super::{stderr, TempDir};

/// One volume at a time in this process: `glusterd` listens on 24007.
static TURN: Mutex<()> = Mutex::new(());

pub struct Gluster {
    dir: TempDir,
    glusterd: Child,
    volume: String,
    created: bool,
    mounts: Vec<PathBuf>,
    // Dropped last: the next test's glusterd starts after this one ended.
    _turn: MutexGuard<'static, ()>,
}

fn host() -> String {
    let o = Command::new("hostname").output().expect("hostname");
    let h = String::from_utf8_lossy(&o.stdout).trim().to_string();
    use std::net::ToSocketAddrs;
    let loopback = (h.as_str(), 0).to_socket_addrs().is_ok_and(|mut a| a.any(|a| a.ip().is_loopback()));
    assert!(
        loopback,
        "GlusterFS bricks need a host name, and this machine's ({h}) does not resolve to a loopback address \
         (add `127.0.0.1 {h}` to /etc/hosts)"
    );
    h
}

impl Gluster {
    pub fn start(tag: &str) -> Gluster {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            Path::new("/usr/sbin/glusterd").exists() || Command::new("glusterd").arg("--version").output().is_ok(),
            "glusterd not found (test.sh installs it: apt-get install glusterfs-server glusterfs-client)"
        );
        assert!(
            std::net::TcpListener::bind("0.0.0.0:24007").is_ok(),
            "port 24007 is taken (a glusterd of the system?): the GlusterFS tests run their own"
        );
        let dir = TempDir::new(tag);
        let d = dir.path();
        for sub in ["wd", "run", "log", "brick0", "brick1"] {
            fs::create_dir(d.join(sub)).unwrap();
        }
        let vol = d.join("glusterd.vol");
        fs::write(
            &vol,
            format!(
                "volume management\n    type mgmt/glusterd\n    option working-directory {wd}\n    \
                 option run-directory {run}\n    option glusterd-sockfile {sock}\n    \
                 option transport-type socket\n    option transport.socket.listen-port 24007\n    \
                 option ping-timeout 0\n    option event-threads 1\nend-volume\n",
                wd = d.join("wd").display(),
                run = d.join("run").display(),
                sock = d.join("glusterd.sock").display(),
            ),
        )
        .unwrap();
        let glusterd = Command::new("glusterd")
            .args(["-N", "--log-level", "WARNING", "-f"])
            .arg(&vol)
            .arg("-l")
            .arg(d.join("log/glusterd.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("glusterd (test.sh installs it: apt-get install glusterfs-server)");
        let volume = format!("ferry{}", std::process::id());
        let mut g = Gluster { dir, glusterd, volume, created: false, mounts: Vec::new(), _turn: turn };
        let up = wait_for(Duration::from_secs(30), || g.cli(&["pool", "list"]).status.success());
        assert!(up, "glusterd did not come up: {}", g.log("glusterd.log"));
        let h = host();
        let d = g.dir.path().to_path_buf();
        let bricks = [format!("{h}:{}", d.join("brick0").display()), format!("{h}:{}", d.join("brick1").display())];
        // `force`: the bricks are on the root file system.
        let vname = g.volume.clone();
        g.ok(&["volume", "create", &vname, "replica", "2", &bricks[0], &bricks[1], "force"]);
        g.created = true;
        g.ok(&["volume", "start", &vname]);
        for i in 0..2 {
            g.mount(&format!("node{i}"), true);
        }
        g
    }

    /// Mounts the volume at `name` in the test's directory, with
    /// `-o aux-gfid-mount` (files open by their gfid at `.gfid/<uuid>`) if
    /// `gfid_access`; unmounted on drop.
    fn mount(&mut self, name: &str, gfid_access: bool) -> PathBuf {
        let (h, vname, d) = (host(), self.volume.clone(), self.dir.path().to_path_buf());
        let mp = d.join(name);
        fs::create_dir(&mp).unwrap();
        let log = format!("log-file={}", d.join(format!("log/{name}.log")).display());
        let opts = if gfid_access { format!("aux-gfid-mount,{log}") } else { log };
        let o = Command::new("timeout")
            .args(["60", "mount", "-t", "glusterfs", "-o", &opts])
            .arg(format!("{h}:/{vname}"))
            .arg(&mp)
            .output()
            .unwrap();
        assert!(o.status.success(), "mount -t glusterfs: {}; {}", stderr(&o), self.log(&format!("{name}.log")));
        self.mounts.push(mp.clone());
        let up = wait_for(Duration::from_secs(30), || {
            fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| m.contains(&format!(" {} ", mp.display())))
        });
        assert!(up, "gluster mount {name} did not come up: {}", self.log(&format!("{name}.log")));
        mp
    }

    /// One more mount of the volume, without `aux-gfid-mount`: no `.gfid`.
    pub fn mount_without_gfid_access(&mut self) -> PathBuf {
        self.mount("plain", false)
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["60", "gluster", "--mode=script"])
            .arg(format!("--glusterd-sock={}", self.dir.path().join("glusterd.sock").display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("gluster (test.sh installs it: apt-get install glusterfs-server)")
    }

    fn ok(&self, args: &[&str]) {
        let o = self.cli(args);
        assert!(
            o.status.success(),
            "gluster {}: {} {}; {}",
            args.join(" "),
            super::stdout(&o),
            stderr(&o),
            self.log("glusterd.log")
        );
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.dir.path().join("log").join(name)).unwrap_or_default()
    }

    /// The volume's two mounts.
    pub fn nodes(&self) -> [PathBuf; 2] {
        [self.mounts[0].clone(), self.mounts[1].clone()]
    }

    /// The volume's two bricks: what it holds, past every mount's cache.
    pub fn bricks(&self) -> [PathBuf; 2] {
        [self.dir.path().join("brick0"), self.dir.path().join("brick1")]
    }

    /// The processes `glusterd` started for the volume (bricks, self-heal),
    /// by the PID files it keeps in its run directory.
    fn spawned(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let run = self.dir.path().join("run");
        for sub in [run.join("vols").join(&self.volume), run.join("shd").join(&self.volume)] {
            for e in fs::read_dir(sub).into_iter().flatten().flatten() {
                if e.path().extension().is_some_and(|x| x == "pid") {
                    if let Some(p) = fs::read_to_string(e.path()).ok().and_then(|s| s.trim().parse().ok()) {
                        pids.push(p);
                    }
                }
            }
        }
        pids
    }
}

impl Drop for Gluster {
    fn drop(&mut self) {
        for mp in &self.mounts {
            let unmounted = Command::new("umount").arg(mp).status().is_ok_and(|s| s.success());
            if !unmounted {
                let _ = Command::new("umount").arg("-l").arg(mp).status();
            }
        }
        let pids = self.spawned();
        if self.created {
            let v = self.volume.clone();
            let _ = self.cli(&["volume", "stop", &v, "force"]);
            let _ = self.cli(&["volume", "delete", &v]);
        }
        let _ = self.glusterd.kill();
        let _ = self.glusterd.wait();
        // What the volume stop did not end (it should have).
        for p in pids {
            let ours = fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*self.dir.path().to_string_lossy()));
            if ours {
                // SAFETY: kill(2) takes no pointers; `p` is a process of this
                // volume (its command line names this test's directory).
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    }
}
