//! Root on a server that squashes root (the default when serving as root):
//! the first upload of the quick start is refused, and both sides say why —
//! the CLI's error names root squash and what to do, the server's log says
//! so once (not once per refusal).

mod common;

use common::{stderr, Server};

#[test]
fn a_squashed_roots_refusal_says_why_on_both_sides() {
    assert!(rustix::process::geteuid().is_root(), "this test is root's (./test.sh runs as root)");
    let server = Server::start(&["--root-squash"]);
    let local = server.state.path().join("notes.txt");
    std::fs::write(&local, b"hello\n").unwrap();
    // The export is root's, 0700 or 0755: the anonymous user may not write it.
    for name in ["/a.txt", "/b.txt", "/c.txt"] {
        let o = server.ferry(&["cp", local.to_str().unwrap(), &server.url(name)]);
        let err = stderr(&o);
        assert!(!o.status.success(), "a squashed root wrote into root's directory");
        assert!(err.contains("Permission denied"), "{err}");
        assert!(err.contains("root") && err.contains("--no-root-squash"), "no hint in: {err}");
        assert!(!err.contains("os error"), "{err}");
    }
    let log = server.log();
    assert_eq!(log.matches("--no-root-squash").count(), 1, "said once: {log}");
    assert!(log.contains("root squash"), "{log}");
    // What anyone may do still works, without a word.
    assert!(server.ferry(&["ls", &server.url("/")]).status.success());
    // A refusal that is not about root squash reads as before.
    let server = Server::start(&[]);
    std::fs::create_dir(server.export.path().join("ro")).unwrap();
    let o = server.ferry(&["rm", &server.url("/nothing-here")]);
    assert!(!stderr(&o).contains("root squash"), "{}", stderr(&o));
}
