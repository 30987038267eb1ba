//! The docs' examples, run as written: README.md and docs/*.md.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{stderr, stdout, Server};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every fenced block of README.md and docs/*.md: (file, info string, text).
fn blocks() -> Vec<(PathBuf, String, String)> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if let Some(info) = l.trim_start().strip_prefix("```") {
                let indent = l.len() - l.trim_start().len();
                let body: Vec<&str> = lines.by_ref().take_while(|l| !l.trim_start().starts_with("```")).collect();
                let body: String =
                    body.iter().map(|l| format!("{}\n", l.get(indent..).unwrap_or(l.trim_start()))).collect();
                out.push((f.clone(), info.trim().to_string(), body));
            }
        }
    }
    out
}

/// The Rust library example of the docs is crates/client/examples/quickstart.rs,
/// word for word, and it builds and runs against a real server.
#[test]
fn the_library_example_is_the_example_that_builds_and_runs() {
    let example = std::fs::read_to_string(repo().join("crates/client/examples/quickstart.rs")).unwrap();
    let rust: Vec<_> = blocks().into_iter().filter(|(_, info, _)| info == "rust").collect();
    assert!(!rust.is_empty(), "no ```rust block in the docs");
    for (file, _, body) in &rust {
        assert_eq!(
            body,
            &example,
            "{}: the rust block differs from crates/client/examples/quickstart.rs",
            file.display()
        );
    }
    let srv = Server::start(&[]);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .current_dir(repo())
        .args(["run", "--release", "--quiet", "-p", "ferry-client", "--example", "quickstart", "--"])
        .arg(srv.addr())
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(srv.export.path().join("notes.txt")).unwrap(), b"hello\n");
    assert!(stdout(&o).lines().any(|l| l == "notes.txt 6"), "{}", stdout(&o));
}
