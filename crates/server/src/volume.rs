//! Whether an export lies on a file system several machines mount at once
//! (NFS, CephFS, JuiceFS, Lustre…), so that other ferry servers may be
//! gateways to the same files: there inode numbers belong to the volume and
//! are the same on every machine, while device numbers are each machine's
//! own.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// File system types whose inode numbers are the shared volume's (as
/// `/proc/self/mountinfo` names them). Not in the list: FUSE file systems
/// that number inodes per mount (`s3fs`, `rclone`, `sshfs`, ferry's own).
const SHARED: &[&str] = &[
    "nfs",
    "nfs4",
    "ceph",
    "lustre",
    "gpfs",
    "beegfs",
    "ocfs2",
    "gfs2",
    "glusterfs",
    "fuse.juicefs",
    "fuse.glusterfs",
    "fuse.ceph-fuse",
    "fuse.ceph",
    "fuse.mfs",
];

/// The type of the shared file system `dir` lies on, if it is one.
pub fn shared_fs_type(dir: &Path) -> Option<String> {
    fs_type(dir).filter(|t| SHARED.contains(&t.as_str()))
}

/// The type of the file system `dir` lies on, as `/proc/self/mountinfo`
/// names it.
pub fn fs_type(dir: &Path) -> Option<String> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fs_type_of(&info, dev)
}

/// GlusterFS's FUSE client, whose files have gfids (`gfid`).
pub const GLUSTERFS: &str = "fuse.glusterfs";

/// Whether `dir` is where a whole file system is mounted (its own root,
/// not a bind mount of a directory inside): then every file of that file
/// system is inside `dir`, which the kernel's file handles can be checked
/// against without a path (FUSE file systems give handles of other mounts
/// no path).
pub fn is_fs_root(dir: &Path) -> bool {
    let (Ok(dir), Ok(info)) = (dir.canonicalize(), std::fs::read_to_string("/proc/self/mountinfo")) else {
        return false;
    };
    is_root_in(&info, &dir.to_string_lossy())
}

fn is_root_in(mountinfo: &str, dir: &str) -> bool {
    // The last mount at `dir` is the one in sight.
    let mut at = mountinfo.lines().rev().filter_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && unescape(f[4]) == dir).then(|| f[3] == "/")
    });
    at.next().unwrap_or(false)
}

/// `mountinfo` writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The file system type of device `dev` in a `mountinfo` text.
fn fs_type_of(mountinfo: &str, dev: u64) -> Option<String> {
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    mountinfo.lines().find_map(|l| {
        let mut f = l.split(' ');
        if f.nth(2)? != want {
            return None;
        }
        // Optional fields end at "-"; the type follows.
        f.skip_while(|x| *x != "-").nth(1).map(str::to_string)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_type_of_a_device() {
        let info = "22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n\
                    40 28 0:40 / /mnt/jfs rw,relatime shared:5 master:1 - fuse.juicefs JuiceFS:vol1 rw,user_id=0\n\
                    41 28 0:41 / /mnt/n rw - nfs4 srv:/x rw,vers=4.2\n";
        assert_eq!(fs_type_of(info, libc::makedev(0, 40)).as_deref(), Some("fuse.juicefs"));
        assert_eq!(fs_type_of(info, libc::makedev(0, 41)).as_deref(), Some("nfs4"));
        assert_eq!(fs_type_of(info, libc::makedev(0, 21)).as_deref(), Some("proc"));
        assert_eq!(fs_type_of(info, libc::makedev(8, 1)), None);
    }

    #[test]
    fn knows_a_file_system_root_from_a_directory_in_one() {
        let info = "40 28 0:40 / /mnt/jfs rw - fuse.juicefs JuiceFS:v rw\n\
                    50 28 0:40 /sub /mnt/bound rw - fuse.juicefs JuiceFS:v rw\n\
                    60 28 0:41 / /mnt/with\\040space rw - nfs4 s:/ rw\n";
        assert!(is_root_in(info, "/mnt/jfs"));
        assert!(!is_root_in(info, "/mnt/bound"));
        assert!(!is_root_in(info, "/mnt/jfs/dir"));
        assert!(is_root_in(info, "/mnt/with space"));
    }

    #[test]
    fn a_local_directory_is_not_shared() {
        assert_eq!(shared_fs_type(Path::new("/proc/self")), None);
    }
}
