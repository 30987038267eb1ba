//! What `ls -l` shows beside the numbers: user and group names from this
//! machine's /etc/passwd and /etc/group (the ids are the server's, named
//! here as NFS clients name them), and sizes for people (`-h`).

use std::collections::HashMap;

/// Id → name tables, read once.
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

fn table(path: &str) -> HashMap<u32, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.parse().ok()?;
            Some((id, name.to_string()))
        })
        .collect()
}

impl Names {
    pub fn load() -> Names {
        Names { users: table("/etc/passwd"), groups: table("/etc/group") }
    }

    pub fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    pub fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
}

/// `ls -h`/`du -h`/`df -h`: 1023, 1.0K, 12K, 1.5M, as coreutils prints
/// (powers of 1024, one decimal below 10, rounded up).
pub fn human(bytes: u64) -> String {
    if bytes < 1024 {
        return bytes.to_string();
    }
    let units = ['K', 'M', 'G', 'T', 'P', 'E'];
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 {
        let r = (v * 10.0).ceil() / 10.0;
        if r < 10.0 {
            return format!("{r:.1}{}", units[u]);
        }
        v = r;
    }
    let r = v.ceil();
    if r >= 1024.0 && u + 1 < units.len() {
        return format!("1.0{}", units[u + 1]);
    }
    format!("{r:.0}{}", units[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_coreutils_prints_them() {
        assert_eq!(human(0), "0");
        assert_eq!(human(1023), "1023");
        assert_eq!(human(1024), "1.0K");
        assert_eq!(human(1025), "1.1K");
        assert_eq!(human(10 * 1024), "10K");
        assert_eq!(human(10 * 1024 + 1), "11K");
        assert_eq!(human(1536 * 1024), "1.5M");
        assert_eq!(human(5 << 30), "5.0G");
    }
}
