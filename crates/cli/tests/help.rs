//! Each command's own help (`ferry CMD --help`, `ferry help CMD`), the shell
//! completions and the man pages: each lists exactly the options its command
//! takes, and the connection options only where they apply.

mod common;

use std::process::{Command, Output};

use common::{stderr, stdout, Server, TempDir, FERRY};

const CONN: &[&str] = &["--token-file", "--tls-ca"];

/// Every visible command and the long options (or short ones, where it has
/// no long form) it takes besides --help and the connection options.
const COMMANDS: &[(&str, &[&str], &[&str])] = &[
    (
        "serve",
        &[
            "--config",
            "--listen",
            "--unix",
            "--read-only",
            "--memory",
            "--allow-devices",
            "--no-auth",
            "--max-connections",
            "--idle-timeout",
            "--session-lease",
            "--lease-time",
            "--state-dir",
            "--no-state",
            "--metrics",
            "--shared-volume",
            "--id-key",
            "--fence-dir",
            "--tls",
            "--no-tls",
            "--tls-cert",
            "--tls-key",
            "--no-root-squash",
            "--root-squash",
            "--anon-uid",
            "--anon-gid",
            "--map-uid",
            "--map-gid",
            "--disable-caps",
        ],
        &["--token-file"],
    ),
    ("cp", &["--recursive", "--preserve", "--archive", "--verbose"], CONN),
    ("sync", &["--delete", "--dry-run", "--checksum", "--verbose"], CONN),
    ("cat", &[], CONN),
    ("ls", &["-l", "-a", "--human-readable", "--recursive", "--numeric-uid-gid"], CONN),
    ("du", &["--summarize", "--human-readable"], CONN),
    ("df", &["--human-readable"], CONN),
    ("stat", &[], CONN),
    ("mkdir", &["-p"], CONN),
    ("rm", &["--recursive", "--force"], CONN),
    ("mv", &[], CONN),
    ("cache", &[], CONN),
    (
        "mount",
        &[
            "--read-only",
            "--attr-timeout",
            "--entry-timeout",
            "--lease-timeout",
            "--allow-other",
            "--cache",
            "--passthrough",
            "-o",
            "--metrics",
            "--hard",
            "--background",
        ],
        CONN,
    ),
    ("umount", &[], &[]),
    ("run", &["--mount", "--library", "--reconnect", "--attr-timeout"], CONN),
    (
        "bench",
        &["--size-mib", "--block-kib", "--runs", "--rtts", "--dir", "--quick", "--fuse", "--run", "--same-host"],
        &[],
    ),
    (
        "compare",
        &[
            "--quick",
            "--runs",
            "--out",
            "--baselines",
            "--bench-dir",
            "--dir",
            "--only",
            "--systems",
            "--idle",
            "--clients",
        ],
        &[],
    ),
    ("soak", &["--clients", "--secs", "--max-file", "--seed", "--dir", "--idle", "--idle-procs", "--server"], &[]),
    ("completions", &[], &[]),
    ("man", &["--dir"], &[]),
];

fn ferry(args: &[&str]) -> Output {
    Command::new(FERRY).args(args).output().unwrap()
}

/// The options a help text shows: its `-x` and `--long` words at the start
/// of an option line.
fn shown_options(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in help.lines().map(str::trim_start).filter(|l| l.starts_with('-')) {
        for w in line.split_whitespace() {
            let w = w.trim_end_matches(',');
            if !w.starts_with('-') {
                break;
            }
            // The long form when there is one, as the table names them.
            if w.starts_with("--") || !line.contains(", --") {
                out.push(w.to_string());
            }
        }
    }
    out
}

#[test]
fn each_command_lists_its_own_options_a_description_and_an_example() {
    for (cmd, own, conn) in COMMANDS {
        let o = ferry(&[cmd, "--help"]);
        assert!(o.status.success(), "ferry {cmd} --help: {}", stderr(&o));
        let help = stdout(&o);
        let mut expect: Vec<String> = own.iter().chain(conn.iter()).map(|s| s.to_string()).collect();
        expect.push("--help".into());
        let mut shown = shown_options(&help);
        expect.sort();
        shown.sort();
        assert_eq!(shown, expect, "ferry {cmd} --help shows other options than it takes:\n{help}");
        // One line saying what it does, then the usage.
        let mut lines = help.lines();
        let about = lines.next().unwrap();
        assert!(!about.is_empty() && about.len() <= 90, "ferry {cmd}: description {about:?}");
        assert_eq!(lines.next(), Some(""), "ferry {cmd}: the description is more than one line:\n{help}");
        assert!(help.contains(&format!("Usage: ferry {cmd} ")), "{help}");
        // An example that uses only options the command takes.
        let example = help
            .split("Example:\n")
            .nth(1)
            .and_then(|e| e.lines().next())
            .unwrap_or_else(|| panic!("ferry {cmd} --help has no example:\n{help}"));
        assert!(example.trim_start().starts_with(&format!("ferry {cmd} ")), "{example}");
        for w in example.split_whitespace().take_while(|w| *w != "--").filter(|w| w.starts_with("--")) {
            assert!(expect.contains(&w.to_string()), "ferry {cmd}'s example uses {w}, which it does not take");
        }
        // `ferry help CMD` is the same page.
        let o = ferry(&["help", cmd]);
        assert!(o.status.success(), "ferry help {cmd}: {}", stderr(&o));
        assert_eq!(stdout(&o), help, "ferry help {cmd} differs from ferry {cmd} --help");
    }
    // The table has every command `ferry --help` lists.
    let top = stdout(&ferry(&["--help"]));
    let listed: Vec<&str> = top
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    let table: Vec<&str> = COMMANDS.iter().map(|c| c.0).collect();
    assert_eq!(listed, table, "{top}");
}

/// The connection options work after the command and before it, and a
/// command that has no use for one refuses it instead of ignoring it.
#[test]
fn connection_options_apply_where_they_are_shown() {
    let srv = Server::start(&[]);
    std::fs::write(srv.export.path().join("f"), b"x").unwrap();
    let tf = srv.token_file.to_str().unwrap();
    let url = srv.url("/");
    for args in [vec!["ls", "--token-file", tf, &url], vec!["--token-file", tf, "ls", &url]] {
        let o = Command::new(FERRY).args(&args).env_remove("FERRY_TOKEN_FILE").env_remove("FERRY_TOKEN").output();
        let o = o.unwrap();
        assert!(o.status.success(), "ferry {args:?}: {}", stderr(&o));
        assert_eq!(stdout(&o), "f\n");
    }
    let o = ferry(&["--tls-ca", "/nonexistent", "serve", "--memory", "--listen", "127.0.0.1:0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--tls-ca does not apply to `ferry serve`"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "it must not have started: {}", stdout(&o));
    let o = ferry(&["--token-file", tf, "umount", "/nonexistent"]);
    assert!(stderr(&o).contains("--token-file does not apply to `ferry umount`"), "{}", stderr(&o));
    let o = ferry(&["umount", "--token-file", tf, "/nonexistent"]);
    assert!(!o.status.success() && stderr(&o).contains("--token-file"), "{}", stderr(&o));
}

/// The bash script, sourced in bash, completes each command's own options.
#[test]
fn bash_completion_is_registered_and_completes_each_commands_options() {
    for (cmd, own, conn) in COMMANDS {
        let script = format!(
            "source <('{FERRY}' completions bash) || exit 9\n\
             complete -p ferry || exit 8\n\
             COMP_WORDS=(ferry {cmd} --); COMP_CWORD=2; COMP_LINE='ferry {cmd} --'; COMP_POINT=${{#COMP_LINE}}\n\
             _ferry ferry -- {cmd}\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        let o = Command::new("bash").arg("-c").arg(&script).output().expect("bash");
        assert!(o.status.success(), "bash: {}", stderr(&o));
        let out = stdout(&o);
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("complete -o bashdefault -o default -o nosort -F _ferry ferry"), "{out}");
        let offered: Vec<&str> = lines.collect();
        for o in own.iter().chain(conn.iter()).filter(|o| o.starts_with("--")) {
            assert!(offered.contains(o), "`ferry {cmd} --<TAB>` does not offer {o}: {offered:?}");
        }
        for o in CONN.iter().filter(|o| !conn.contains(o)) {
            assert!(!offered.contains(o), "`ferry {cmd} --<TAB>` offers {o}, which it does not take");
        }
        if *cmd != "serve" {
            assert!(!offered.contains(&"--listen"), "`ferry {cmd} --<TAB>` offers serve's --listen");
        }
    }
}

#[test]
fn zsh_and_fish_scripts_name_every_command() {
    let zsh = stdout(&ferry(&["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef ferry"), "{}", &zsh[..zsh.len().min(200)]);
    let fish = stdout(&ferry(&["completions", "fish"]));
    for (cmd, _, _) in COMMANDS {
        assert!(zsh.contains(&format!("'{cmd}:")), "zsh: no {cmd}");
        assert!(fish.contains(&format!("-a \"{cmd}\"")), "fish: no {cmd}");
    }
    assert!(fish.contains("complete -c ferry"));
    let o = ferry(&["completions", "tcsh"]);
    assert!(!o.status.success() && stderr(&o).contains("possible values: bash, zsh, fish"), "{}", stderr(&o));
}

/// The pages render with groff (test.sh installs it), and name each
/// command's options.
#[test]
fn man_pages_render_and_list_each_commands_options() {
    // -k: UTF-8 input through preconv, as man(1) reads pages.
    let render = |roff: &[u8]| -> String {
        let mut child = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-P", "-cbou", "-ww"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("groff is needed (test.sh installs groff-base)");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(roff).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success() && o.stderr.is_empty(), "groff: {}", stderr(&o));
        // Justified text: the words, one space apart.
        stdout(&o).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let top = ferry(&["man"]);
    assert!(top.status.success(), "{}", stderr(&top));
    assert!(stdout(&top).contains(".TH ferry 1"), "{}", stdout(&top));
    let text = render(&top.stdout);
    assert!(text.contains("SYNOPSIS") && text.contains("SUBCOMMANDS"), "{text}");
    for (cmd, own, conn) in COMMANDS {
        assert!(text.contains(&format!("ferry-{cmd}(1)")), "ferry(1) does not list ferry-{cmd}(1)");
        let o = ferry(&["man", cmd]);
        assert!(o.status.success(), "ferry man {cmd}: {}", stderr(&o));
        let page = render(&o.stdout);
        assert!(page.contains(&format!("ferry-{cmd} - ")) && page.contains("OPTIONS"), "{page}");
        for opt in own.iter().chain(conn.iter()) {
            assert!(page.contains(opt), "ferry-{cmd}(1) does not name {opt}:\n{page}");
        }
        assert!(page.contains("Example:"), "ferry-{cmd}(1) has no example");
    }
    let o = ferry(&["man", "nosuch"]);
    assert!(!o.status.success() && stderr(&o).contains("no such command: nosuch"), "{}", stderr(&o));
    // `man -l` reads the written pages as the installed ones are read.
    let tmp = TempDir::new("man");
    let o = ferry(&["man", "--dir", tmp.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new("man")
        .arg("-l")
        .arg(tmp.path().join("ferry-cp.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "200")
        .output()
        .expect("man is needed (test.sh installs man-db)");
    assert!(o.status.success(), "man -l: {}", stderr(&o));
    assert!(stdout(&o).contains("--archive"), "{}", stdout(&o));
}
