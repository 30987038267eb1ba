#!/usr/bin/env bash
# The Python package's tests: its Rust crate's format and lints, then the
# package installed with pip into a virtual environment (target/pyvenv) and
# pytest against real `ferry serve` processes (the release build of the CLI;
# FERRY_BIN overrides). Run from anywhere; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd .. && pwd)

echo "== python: format and lints of the extension crate"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings

venv="$repo/target/pyvenv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
echo "== python: install test tools and the package (pip install ./python)"
"$venv/bin/pip" install -q --disable-pip-version-check maturin pytest fsspec pandas pyarrow
# From the repository root, exactly as the README says (a local directory is
# always rebuilt and reinstalled).
(cd "$repo" && "$venv/bin/pip" install -q --disable-pip-version-check ./python)

[ -x "${FERRY_BIN:-$repo/target/release/ferry}" ] || (cd "$repo" && cargo build --release -p ferry-cli)

echo "== python: pytest"
# Outside the source tree, so `import ferry` is the installed package.
cd tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
