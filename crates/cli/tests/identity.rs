//! Requests act as the user who made them (capability `IDENTITY`,
//! PROTOCOL.md 8.8): a server running as root switches its serving thread
//! to each caller's ids, so the kernel of the server checks permissions and
//! gives new files their creator; root is squashed unless the export allows
//! it; ids can be mapped. Through the library (`as_caller`), the CLI and
//! `ferry run` (the calling process's ids), and a FUSE mount open to every
//! user (each request's caller), with users made by `setpriv`.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::fuse::{mount_url, require_fuse, Detach};
use common::restart::Serve;
use common::{Server, TempDir, FERRY};
use ferry_client::{as_caller, caps, Caller, Client, OpenOptions, Options};

const ALICE: u32 = 4321;
const BOB: u32 = 4322;
/// A group Alice is in and Bob is not.
const TEAM: u32 = 4777;

fn alice() -> Caller {
    Caller { uid: ALICE, gid: ALICE, groups: vec![TEAM] }
}

fn bob() -> Caller {
    Caller { uid: BOB, gid: BOB, groups: vec![] }
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

fn mode(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid())
}

/// An export other users may enter: `open/` (0777) for anyone's files,
/// `secret` (root's, 0600), `team` (root's, group TEAM, 0640); and a token
/// those users may read.
fn populate(export: &Path, state: &Path) -> PathBuf {
    mode(export, 0o755);
    mode(state, 0o755);
    fs::create_dir(export.join("open")).unwrap();
    mode(&export.join("open"), 0o777);
    fs::write(export.join("secret"), b"root only\n").unwrap();
    mode(&export.join("secret"), 0o600);
    fs::write(export.join("team"), b"team only\n").unwrap();
    chown(&export.join("team"), 0, TEAM);
    mode(&export.join("team"), 0o640);
    let token = state.join("public-token");
    fs::copy(state.join("token"), &token).unwrap();
    mode(&token, 0o644);
    token
}

fn errno_of(r: ferry_client::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

#[test]
fn library_requests_act_as_their_caller_and_keep_doing_so_across_a_restart() {
    let state = TempDir::new("id-lib");
    let export = state.path().join("export");
    fs::create_dir(&export).unwrap();
    let token = state.path().join("token");
    let mut server = Serve::start(&export, 0, &token);
    let port = server.port;
    populate(&export, state.path());
    let opts = Options {
        token: Some(fs::read_to_string(&token).unwrap().trim().as_bytes().to_vec()),
        reconnect: Some(Duration::from_secs(20)),
        ..Options::default()
    };
    let c = Client::connect(&format!("127.0.0.1:{port}"), &opts).unwrap();
    assert!(c.engine().has_cap(caps::IDENTITY), "a root server on a directory acts as each caller");

    as_caller(alice(), || {
        c.write("/open/alice", b"mine").unwrap();
        assert_eq!(c.read("/team").unwrap(), b"team only\n", "Alice is in the team");
        assert_eq!(errno_of(c.read("/secret")), libc::EACCES);
        assert_eq!(errno_of(c.set_permissions(ferry_client::Target::Path(b"/secret"), 0o644)), libc::EPERM);
        c.create_dir("/open/alice-dir", 0o755).unwrap();
    });
    assert_eq!(owner(&export.join("open/alice")), (ALICE, ALICE));
    assert_eq!(owner(&export.join("open/alice-dir")), (ALICE, ALICE));
    as_caller(bob(), || {
        assert_eq!(errno_of(c.read("/team")), libc::EACCES, "Bob is not in the team");
        // Alice's directory is 0755: Bob may look, not write.
        assert_eq!(errno_of(c.write("/open/alice-dir/bob", b"x")), libc::EACCES);
        assert_eq!(errno_of(c.remove_file("/open/alice")), 0, "open/ is 0777 without the sticky bit");
    });
    // This thread's own ids: root, which this export lets be root.
    assert_eq!(c.read("/secret").unwrap(), b"root only\n");

    // A restarted server knows no caller slots: the client names them
    // again (ENOKEY, then Caller) and goes on as the same users.
    server.kill();
    let _server = Serve::start(&export, port, &token);
    as_caller(alice(), || c.write("/open/after-restart", b"still Alice").unwrap());
    assert_eq!(owner(&export.join("open/after-restart")), (ALICE, ALICE));
    as_caller(bob(), || assert_eq!(errno_of(c.read("/team")), libc::EACCES));
    // An open file goes on as its opener: Alice's write through a handle
    // opened before is hers (the handle, not the caller, decides).
    let mut f = as_caller(alice(), || {
        c.open("/open/handle", OpenOptions::new().write(true).create(true).truncate(true)).unwrap()
    });
    std::io::Write::write_all(&mut f, b"data").unwrap();
    drop(f);
    assert_eq!(owner(&export.join("open/handle")), (ALICE, ALICE));
    assert_eq!(fs::read(export.join("open/handle")).unwrap(), b"data");
}

#[test]
fn root_is_squashed_unless_the_export_allows_it() {
    let server = Server::start(&["--root-squash"]);
    populate(server.export.path(), server.state.path());
    let c = server.client();
    assert_eq!(errno_of(c.read("/secret")), libc::EACCES, "the client's root is nobody here");
    assert_eq!(errno_of(c.write("/made-by-root", b"x")), libc::EACCES, "nobody may not write the root's directory");
    c.write("/open/squashed", b"x").unwrap();
    assert_eq!(owner(&server.export.path().join("open/squashed")), (65534, 65534));

    let server = Server::start(&["--root-squash", "--anon-uid", "4444", "--anon-gid", "4445"]);
    populate(server.export.path(), server.state.path());
    server.client().write("/open/anon", b"x").unwrap();
    assert_eq!(owner(&server.export.path().join("open/anon")), (4444, 4445));

    // The test servers' default: root stays root.
    let server = Server::start(&[]);
    populate(server.export.path(), server.state.path());
    let c = server.client();
    assert_eq!(c.read("/secret").unwrap(), b"root only\n");
    c.write("/open/root", b"x").unwrap();
    assert_eq!(owner(&server.export.path().join("open/root")), (0, 0));
}

#[test]
fn ids_are_mapped_before_they_are_used() {
    let server = Server::start(&["--map-uid", "4321=4400", "--map-gid", &format!("4321=4401,{TEAM}=4402")]);
    populate(server.export.path(), server.state.path());
    chown(&server.export.path().join("team"), 0, 4402);
    let c = server.client();
    as_caller(alice(), || {
        c.write("/open/mapped", b"x").unwrap();
        assert_eq!(c.read("/team").unwrap(), b"team only\n", "TEAM is 4402 on the server");
    });
    assert_eq!(owner(&server.export.path().join("open/mapped")), (4400, 4401));
}

#[test]
fn servers_that_cannot_switch_ids_do_not_offer_to() {
    let memory = Server::start(&["--memory"]);
    assert!(!memory.client().engine().has_cap(caps::IDENTITY), "the memory backend has no kernel to check");
    let off = Server::start(&["--disable-caps", "identity"]);
    populate(off.export.path(), off.state.path());
    let c = off.client();
    assert!(!c.engine().has_cap(caps::IDENTITY));
    // Without it every request is the server's own (root's) again.
    as_caller(bob(), || c.write("/open/as-server", b"x").unwrap());
    assert_eq!(owner(&off.export.path().join("open/as-server")), (0, 0));
}

/// Runs `cmd` as `uid` (primary group the same, supplementary `groups`),
/// with a home of its own.
fn as_user(uid: u32, groups: &[u32], home: &Path, cmd: &[&str]) -> Output {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}"));
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        c.arg(format!("--groups={}", groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",")));
    }
    c.args(cmd).env("HOME", home).env_remove("XDG_CONFIG_HOME").stdin(Stdio::null());
    c.output().expect("setpriv (util-linux) is needed for this test")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn ferry_run_and_the_cli_act_as_the_user_who_runs_them() {
    let server = Server::start(&[]);
    let token = populate(server.export.path(), server.state.path());
    let home = server.state.path().join("home");
    fs::create_dir(&home).unwrap();
    mode(&home, 0o777);
    let url = server.url("/");
    let tf = format!("--token-file={}", token.display());
    let script = "echo hers > /r/open/run-file && mkdir -p /r/open/run-dir/a/b && chmod 600 /r/open/run-file \
                  && cat /r/team && if cat /r/secret; then exit 9; fi; exit 0";
    let o =
        as_user(ALICE, &[TEAM], &home, &[FERRY, &tf, "run", "--mount", &format!("/r={url}"), "--", "sh", "-c", script]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("team only") && text(&o).contains("Permission denied"), "{}", text(&o));
    let e = server.export.path();
    for p in ["open/run-file", "open/run-dir", "open/run-dir/a/b"] {
        assert_eq!(owner(&e.join(p)), (ALICE, ALICE), "{p}");
    }
    // Bob may neither read Alice's 0600 file nor write in her directory.
    let script = "cat /r/open/run-file; touch /r/open/run-dir/bob; cat /r/team; exit 0";
    let o = as_user(BOB, &[], &home, &[FERRY, &tf, "run", "--mount", &format!("/r={url}"), "--", "sh", "-c", script]);
    assert_eq!(text(&o).matches("Permission denied").count(), 3, "{}", text(&o));
    assert!(!e.join("open/run-dir/bob").exists());
    // The CLI: a copy made by Bob is Bob's; his read of the secret is refused.
    let local = home.join("bobs");
    fs::write(&local, b"from bob").unwrap();
    mode(&local, 0o644);
    let o = as_user(BOB, &[], &home, &[FERRY, &tf, "cp", local.to_str().unwrap(), &server.url("/open/bobs")]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(owner(&e.join("open/bobs")), (BOB, BOB));
    let o = as_user(BOB, &[], &home, &[FERRY, &tf, "cat", &server.url("/secret")]);
    assert!(!o.status.success() && text(&o).contains("Permission denied"), "{}", text(&o));
}

#[test]
fn a_mount_open_to_all_users_acts_as_each_without_default_permissions() {
    require_fuse();
    let server = Server::start(&[]);
    let token = populate(server.export.path(), server.state.path());
    let home = server.state.path().join("home");
    fs::create_dir(&home).unwrap();
    mode(&home, 0o777);
    let mp = server.state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    mode(&mp, 0o755);
    let _m = mount_url(&server.url("/"), &mp, &token, &["--allow-other"]);
    let _d = Detach(mp.clone());
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts.lines().find(|l| l.contains(mp.to_str().unwrap())).expect("mounted");
    assert!(!line.contains("default_permissions"), "the server checks, not the kernel: {line}");

    let m = mp.display();
    let script = format!(
        "set -e; echo hers > {m}/open/f; mkdir {m}/open/d; ln -s f {m}/open/l; mkfifo {m}/open/p; \
         touch {m}/open/t; chmod 600 {m}/open/f; cat {m}/team; if cat {m}/secret; then exit 9; fi"
    );
    let o = as_user(ALICE, &[TEAM], &home, &["sh", "-c", &script]);
    assert!(o.status.success(), "{}", text(&o));
    for n in ["f", "d", "l", "p", "t"] {
        assert_eq!(owner(&server.export.path().join("open").join(n)), (ALICE, ALICE), "{n}");
    }
    let script = format!("cat {m}/open/f; touch {m}/open/d/bob; cat {m}/team; exit 0");
    let o = as_user(BOB, &[], &home, &["sh", "-c", &script]);
    assert_eq!(text(&o).matches("Permission denied").count(), 3, "{}", text(&o));
    assert!(!server.export.path().join("open/d/bob").exists());
    // Root (not squashed on this export) is root through the mount too.
    assert_eq!(fs::read(mp.join("secret")).unwrap(), b"root only\n");
}

/// A change's breaks go out before it runs only when the change is surely
/// its caller's to make (issue 30's early breaks): a caller refused a
/// change to what it does not own breaks no one's lease, so whoever can
/// name an object can neither have its holders' caches dropped at will
/// nor time who holds what. A change the caller may make still breaks.
#[test]
fn a_change_its_caller_is_refused_breaks_no_lease() {
    let state = TempDir::new("id-breaks");
    let export = state.path().join("export");
    fs::create_dir(&export).unwrap();
    let token = state.path().join("token");
    let server = Serve::start(&export, 0, &token);
    populate(&export, state.path());
    fs::write(export.join("open/bobs"), b"Bob's\n").unwrap();
    chown(&export.join("open/bobs"), BOB, BOB);
    let opts =
        Options { token: Some(fs::read_to_string(&token).unwrap().trim().as_bytes().to_vec()), ..Options::default() };
    let addr = format!("127.0.0.1:{}", server.port);
    let holder = Client::connect(&addr, &opts).unwrap();
    let leases = ferry_client::Leases::new(Box::new(|_, ret| drop(ret)));
    holder.leases_on(std::sync::Arc::clone(&leases)).unwrap();
    let other = Client::connect(&addr, &opts).unwrap();
    let secret = ferry_client::Target::Path(b"/secret");
    for round in 0..50 {
        holder.metadata("/secret").unwrap();
        holder.metadata("/").unwrap();
        assert!(leases.held(), "round {round}: the holder holds no lease");
        let before = leases.breaks();
        as_caller(bob(), || {
            assert_eq!(errno_of(other.set_permissions(secret, 0o644)), libc::EPERM);
            assert_eq!(errno_of(other.truncate(secret, 0)), libc::EACCES);
            assert_eq!(errno_of(other.remove_file("/secret")), libc::EACCES);
            assert_eq!(errno_of(other.rename("/secret", "/open/taken")), libc::EACCES);
            assert_eq!(errno_of(other.write("/made-by-bob", b"x")), libc::EACCES);
        });
        assert_eq!(leases.breaks(), before, "round {round}: Bob's refused changes broke the holder's leases");
    }
    assert_eq!(fs::read(export.join("secret")).unwrap(), b"root only\n");
    // Bob's change to his own file breaks its holder before it returns.
    holder.metadata("/open/bobs").unwrap();
    let before = leases.breaks();
    as_caller(bob(), || other.set_permissions(ferry_client::Target::Path(b"/open/bobs"), 0o600).unwrap());
    assert!(leases.breaks() > before, "Bob's chmod of his own file broke no lease");
}
