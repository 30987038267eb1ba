//! Every input a fuzz target ever failed on (`fuzz/regressions/TARGET/`),
//! and the corpus the targets built (`fuzz/corpus/TARGET/`), run again
//! through the same entry points: a fixed bug stays fixed.

use std::path::Path;

/// A fuzz target's entry point.
type Target = fn(&[u8]);

fn replay(dir: &str, target: &str, run: Target) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz").join(dir).join(target);
    let entries = std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let mut n = 0;
    for e in entries {
        let p = e.unwrap().path();
        if p.file_name().is_some_and(|f| f.to_string_lossy().starts_with('.')) {
            continue;
        }
        let data = std::fs::read(&p).unwrap();
        run(&data);
        n += 1;
    }
    n
}

#[test]
fn the_fuzz_targets_pass_every_input_kept() {
    use ferry_server::fuzz;
    let targets: [(&str, Target); 4] =
        [("decode_frame", fuzz::frame), ("handshake", fuzz::handshake), ("session", fuzz::session), ("tls", fuzz::tls)];
    let mut corpus = 0;
    for (t, run) in targets {
        replay("regressions", t, run);
        corpus += replay("corpus", t, run);
    }
    assert!(corpus > 0, "no corpus kept under fuzz/corpus");
}
