#!/usr/bin/env bash
# Runs the fuzz targets: ./fuzz/run.sh [SECONDS] [TARGET...]
# (default: 60 s each, every target). Built on the stable toolchain with
# libFuzzer's coverage instrumentation (what cargo-fuzz does with
# `--sanitizer none`). The corpus grows in fuzz/corpus/TARGET (keep what it
# adds: commit it); a crash is saved under fuzz/regressions/TARGET, where
# the server crate's tests replay every file (`cargo test -p ferry-server
# --test fuzz_regressions`), and the run fails.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
# FERRY_FUZZ_CORPUS: run on a copy (the test suite does), leaving
# fuzz/corpus as committed.
corpus="${FERRY_FUZZ_CORPUS:-corpus}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode_frame handshake session tls)
host="$(rustc -vV | sed -n 's/^host: //p')"
# --target keeps the instrumentation off build scripts (host code).
RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks" \
  cargo build --release --target "$host" --bins
status=0
for t in "${targets[@]}"; do
  mkdir -p "$corpus/$t" "regressions/$t" "artifacts/$t"
  echo "== fuzz $t for $secs s"
  if ! "target/$host/release/$t" "$corpus/$t" -max_total_time="$secs" -max_len=65536 \
      -artifact_prefix="artifacts/$t/" -print_final_stats=1 2>&1 | tail -n 12; then
    status=1
  fi
  # Keep the corpus small: only inputs that add coverage.
  rm -rf "$corpus/$t.min" && mkdir "$corpus/$t.min"
  "target/$host/release/$t" -merge=1 "$corpus/$t.min" "$corpus/$t" >/dev/null 2>&1 &&
    rm -rf "${corpus:?}/$t" && mv "$corpus/$t.min" "$corpus/$t"
  for a in artifacts/"$t"/*; do
    [ -e "$a" ] || continue
    cp "$a" "regressions/$t/"
    echo "fuzz: $t: a failing input, kept as regressions/$t/$(basename "$a")" >&2
    status=1
  done
  rm -rf "artifacts/$t"
done
exit $status
