//! A `ferry serve` that a test kills and starts again on the same port and
//! directory (a server restart), its sessions' state beside its token.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::FERRY;

/// A `ferry serve` of `dir` on a given port (0: any), killed on drop.
pub struct Serve {
    child: Child,
    pub port: u16,
}

impl Serve {
    pub fn start(dir: &Path, port: u16, token_file: &Path) -> Serve {
        Serve::launch(dir.as_os_str(), port, token_file)
    }

    /// `ferry serve --memory`: its files live as long as the process.
    pub fn start_memory(port: u16, token_file: &Path) -> Serve {
        Serve::launch("--memory".as_ref(), port, token_file)
    }

    pub fn launch(export: &std::ffi::OsStr, port: u16, token_file: &Path) -> Serve {
        Serve::launch_with(export, port, token_file, &[])
    }

    pub fn launch_with(export: &std::ffi::OsStr, port: u16, token_file: &Path, extra: &[&str]) -> Serve {
        Serve::launch_logged(export, port, token_file, extra, None)
    }

    /// As `launch_with`, the server's log (its stderr) appended to `log`.
    pub fn launch_logged(
        export: &std::ffi::OsStr,
        port: u16,
        token_file: &Path,
        extra: &[&str],
        log: Option<&Path>,
    ) -> Serve {
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(p).unwrap()),
            None => Stdio::null(),
        };
        let mut child = Command::new(FERRY)
            .arg("serve")
            .arg(export)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--no-root-squash", "--token-file"])
            .arg(token_file)
            .args(extra)
            // The sessions' default state directory, beside the token.
            .env("XDG_STATE_HOME", token_file.parent().unwrap())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).expect("listening line");
        Serve { child, port }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `python3 -c SCRIPT` under `ferry run --mount /remote=ferry://127.0.0.1:PORT/`
/// (bounded by `timeout 120`), its output piped.
pub fn python_under_ferry_run(port: u16, token: &Path, script: &str) -> Child {
    Command::new("timeout")
        .args(["120", FERRY, "run", "--mount"])
        .arg(format!("/remote=ferry://127.0.0.1:{port}/"))
        .args(["--", "python3", "-c", script])
        .env("FERRY_TOKEN_FILE", token)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}
