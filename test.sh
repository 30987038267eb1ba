#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this). Installs what it
# needs, then: formatting, lints, docs, unit/property/end-to-end tests, and
# the benchmark in its tiny mode so it cannot rot.
set -euo pipefail
cd "$(dirname "$0")"

# Tools the suite needs. Rust comes from rustup; nothing else is required yet.
if ! command -v cargo >/dev/null; then
  echo "test.sh: cargo not found; install Rust (https://rustup.rs)" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== format"
cargo fmt --all -- --check

echo "== clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --release --quiet

echo "== tests"
# Release build: the end-to-end tests move hundreds of MiB.
cargo test --workspace --release

echo "== benchmark (quick mode)"
./target/release/ferry bench --quick

echo "test.sh: all green"
