#!/usr/bin/env bash
# The Python package's tests: its Rust crate's format and lints, then the
# package installed with pip into a virtual environment (target/pyhome/.venvs/ferry,
# by docs/python.md's own commands) and
# pytest against real `ferry serve` processes (the release build of the CLI;
# FERRY_BIN overrides). Run from anywhere; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd .. && pwd)

echo "== python: format and lints of the extension crate"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings

# docs/python.md's install commands, run as written (its `sh test-python`
# block) with HOME in target/pyhome: they make the virtual environment
# ~/.venvs/ferry and install the package, pandas and pyarrow into it.
home="$repo/target/pyhome"
venv="$home/.venvs/ferry"
mkdir -p "$home"
echo "== python: docs/python.md's install commands (python3 -m venv, pip install ./python, pandas, pyarrow)"
install=$(awk '/^```sh test-python$/{f=1; next} /^```/{f=0} f' "$repo/docs/python.md")
[ -n "$install" ] || { echo "python/test.sh: no sh test-python block in docs/python.md" >&2; exit 1; }
# Rust and pip's cache stay where they are; only HOME moves.
(cd "$repo" && CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" \
  PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" PIP_DISABLE_PIP_VERSION_CHECK=1 \
  HOME="$home" bash -euo pipefail -c "$install")
echo "== python: test tools"
"$venv/bin/pip" install -q --disable-pip-version-check maturin pytest fsspec

[ -x "${FERRY_BIN:-$repo/target/release/ferry}" ] || (cd "$repo" && cargo build --release -p ferry-cli)

echo "== python: pytest"
# Outside the source tree, so `import ferry` is the installed package.
cd tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
