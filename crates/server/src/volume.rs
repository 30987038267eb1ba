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
    let dev = std::fs::metadata(dir).ok()?.dev();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fs_type_of(&info, dev).filter(|t| SHARED.contains(&t.as_str()))
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
    fn a_local_directory_is_not_shared() {
        assert_eq!(shared_fs_type(Path::new("/proc/self")), None);
    }
}
