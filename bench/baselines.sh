#!/bin/sh
# The baselines `ferry compare` measures ferry against, on 127.0.0.1:
# NFS-Ganesha (libnfs client, NFSv3 and v4), diod (9P2000.L), Samba
# (libsmbclient) and sshfs (over a private sshd, and over socat+sftp-server).
#
#   bench/baselines.sh install              apt-get the packages (daemons not auto-started)
#   bench/baselines.sh clients OUTDIR       compile the C measurement clients into OUTDIR
#   bench/baselines.sh start EXPORT STATE   start every baseline exporting EXPORT
#   bench/baselines.sh stop STATE           stop what `start` started (by PID), unmount sshfs
#
# `start` prints one line per baseline, `up NAME ...` or `down NAME: reason`,
# and writes STATE/status with the same lines: a baseline that cannot start
# is reported, never silently dropped. Everything listens on 127.0.0.1
# (rpcbind listens on the wildcard: `rpcbind -h 127.0.0.1` crashes on
# Debian 12; only loopback clients use it). Ports: NFS 2049 (MOUNT 20048),
# 9P 5640, SMB 445, sshd 2222, socat/sftp-server 2223.
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
CONF=$HERE/conf

PACKAGES="nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils libnfs-dev openssh-server
openssh-client sshfs fuse3 socat diod samba smbclient libsmbclient-dev gcc libc6-dev iproute2"

die() { echo "baselines.sh: $*" >&2; exit 1; }

install() {
    # A policy-rc.d that exits 101 keeps the packaged daemons from starting
    # on install; ours is removed again unless one was already there.
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    rc=0
    # shellcheck disable=SC2086
    if ! dpkg -s $PACKAGES >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null || rc=$?
    fi
    [ -n "$made_policy" ] && rm -f /usr/sbin/policy-rc.d
    [ $rc -eq 0 ] || die "apt-get install failed ($rc)"
    echo "baselines installed"
}

clients() {
    out=${1:?usage: clients OUTDIR}
    mkdir -p "$out"
    src=$HERE/clients
    flags="-O2 -Wall -Wextra -std=gnu11"
    ok=0
    gcc $flags -o "$out/fsbench" "$src/common.c" "$src/posix.c" -lm || ok=1
    gcc $flags -o "$out/p9bench" "$src/common.c" "$src/p9.c" -lm || ok=1
    if [ -e /usr/include/nfsc/libnfs.h ]; then
        gcc $flags -o "$out/nfsbench" "$src/common.c" "$src/nfs.c" -lnfs -lm || ok=1
    else
        echo "baselines.sh: libnfs-dev missing, no nfsbench" >&2
    fi
    if [ -e /usr/include/samba-4.0/libsmbclient.h ]; then
        gcc $flags -I/usr/include/samba-4.0 -o "$out/smbbench" "$src/common.c" "$src/smb.c" -lsmbclient -lm || ok=1
    else
        echo "baselines.sh: libsmbclient-dev missing, no smbbench" >&2
    fi
    return $ok
}

# Starts "$@" in the background with output to LOG, records its PID.
spawn() {
    name=$1 log=$2
    shift 2
    "$@" >"$log" 2>&1 &
    echo $! > "$STATE/$name.pid"
}

# Waits up to $2 tenths of a second for the command in $1 to succeed.
wait_for() {
    i=0
    while [ $i -lt "$2" ]; do
        sh -c "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

alive() { [ -s "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

report() {
    echo "$*" | tee -a "$STATE/status"
}

subst() { sed -e "s#@EXPORT@#$EXPORT#g" -e "s#@STATE@#$STATE#g" "$1" > "$2"; }

start() {
    EXPORT=$(cd "${1:?usage: start EXPORT STATE}" && pwd) || die "no export dir"
    mkdir -p "${2:?usage: start EXPORT STATE}"
    STATE=$(cd "$2" && pwd)
    : > "$STATE/status"
    echo "$EXPORT" > "$STATE/export"

    # rpcbind + NFS-Ganesha (VFS FSAL, NFSv3 and v4).
    if ! command -v ganesha.nfsd >/dev/null; then
        report "down nfs: ganesha.nfsd not installed (run bench/baselines.sh install)"
    elif ss -ltn 2>/dev/null | grep -q '127.0.0.1:2049 \|\*:2049 \|0.0.0.0:2049 '; then
        report "down nfs: port 2049 already in use"
    else
        mkdir -p /var/lib/nfs/ganesha /var/run/ganesha /run/rpcbind
        if ! pgrep -x rpcbind >/dev/null; then
            spawn rpcbind "$STATE/rpcbind.log" rpcbind -f -w
        fi
        subst "$CONF/ganesha.conf" "$STATE/ganesha.conf"
        spawn ganesha "$STATE/ganesha.out" ganesha.nfsd -F -L "$STATE/ganesha.log" -f "$STATE/ganesha.conf" \
            -N NIV_EVENT -p "$STATE/ganesha.pidfile"
        if wait_for "nfs-ls nfs://127.0.0.1$EXPORT" 150 && alive ganesha; then
            report "up nfs nfs://127.0.0.1$EXPORT nfs://127.0.0.1/export?version=4"
        else
            report "down nfs: ganesha did not answer within 15 s (see $STATE/ganesha.log)"
        fi
    fi

    # diod, 9P2000.L.
    if ! command -v diod >/dev/null; then
        report "down 9p: diod not installed"
    else
        spawn diod "$STATE/diod.out" diod -f -n -l 127.0.0.1:5640 -e "$EXPORT" -L "$STATE/diod.log" -c /dev/null
        if wait_for "diodls -s 127.0.0.1:5640 -a $EXPORT /" 100 && alive diod; then
            report "up 9p 127.0.0.1:5640 $EXPORT"
        else
            report "down 9p: diod did not answer within 10 s (see $STATE/diod.log)"
        fi
    fi

    # Samba. No --no-process-group: smbd then calls setsid() itself and
    # signals only its own process group on shutdown, not our daemons.
    if ! command -v smbd >/dev/null; then
        report "down smb: smbd not installed"
    else
        mkdir -p "$STATE/samba/private" "$STATE/samba/lock" "$STATE/samba/state" "$STATE/samba/cache" \
            "$STATE/samba/pid" "$STATE/samba/log"
        subst "$CONF/smb.conf" "$STATE/smb.conf"
        printf 'ferrybench\nferrybench\n' | smbpasswd -c "$STATE/smb.conf" -s -a root >/dev/null 2>&1
        spawn smbd "$STATE/smbd.log" smbd -F --debug-stdout -s "$STATE/smb.conf"
        if wait_for "smbclient -s $STATE/smb.conf -U root%ferrybench //127.0.0.1/export -c ls" 150 && alive smbd; then
            report "up smb smb://127.0.0.1/export root ferrybench"
        else
            report "down smb: smbd did not answer within 15 s (see $STATE/smbd.log)"
        fi
    fi

    # sshd + sshfs (default cipher), and socat + sftp-server + sshfs directport.
    if ! command -v sshfs >/dev/null || [ ! -x /usr/sbin/sshd ]; then
        report "down sshfs: sshfs or sshd not installed"
        report "down sshfs-direct: sshfs not installed"
    else
        mkdir -p "$STATE/ssh" "$STATE/mnt-sshfs" "$STATE/mnt-sshfs-direct" /run/sshd
        [ -e "$STATE/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/ssh/host_ed25519"
        [ -e "$STATE/ssh/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/ssh/client_ed25519"
        cp "$STATE/ssh/client_ed25519.pub" "$STATE/ssh/authorized_keys"
        subst "$CONF/sshd_config" "$STATE/sshd_config"
        spawn sshd "$STATE/sshd.out" /usr/sbin/sshd -D -f "$STATE/sshd_config" -E "$STATE/sshd.log"
        # direct_io: every read and write goes to the server at the
        # application's size (as libnfs, libsmbclient and ferry do), and no
        # attribute caching, so stat is a real round trip.
        SSHFS_OPTS="-o direct_io -o attr_timeout=0 -o entry_timeout=0 -o negative_timeout=0 -o dir_cache=no"
        if wait_for "ss -ltn | grep -q 127.0.0.1:2222" 50; then
            # shellcheck disable=SC2086
            spawn sshfs "$STATE/sshfs.log" sshfs -f $SSHFS_OPTS -o IdentityFile="$STATE/ssh/client_ed25519" \
                -o Port=2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
                "root@127.0.0.1:$EXPORT" "$STATE/mnt-sshfs"
            if wait_for "mountpoint -q $STATE/mnt-sshfs" 100; then
                report "up sshfs $STATE/mnt-sshfs"
            else
                report "down sshfs: mount did not appear (see $STATE/sshfs.log)"
            fi
        else
            report "down sshfs: sshd did not listen (see $STATE/sshd.log)"
        fi
        if command -v socat >/dev/null; then
            spawn socat "$STATE/socat.log" socat TCP-LISTEN:2223,bind=127.0.0.1,reuseaddr,fork,nodelay \
                EXEC:/usr/lib/openssh/sftp-server
            if wait_for "ss -ltn | grep -q 127.0.0.1:2223" 50; then
                # shellcheck disable=SC2086
                spawn sshfs-direct "$STATE/sshfs-direct.log" sshfs -f $SSHFS_OPTS -o directport=2223 \
                    "127.0.0.1:$EXPORT" "$STATE/mnt-sshfs-direct"
                if wait_for "mountpoint -q $STATE/mnt-sshfs-direct" 100; then
                    report "up sshfs-direct $STATE/mnt-sshfs-direct"
                else
                    report "down sshfs-direct: mount did not appear (see $STATE/sshfs-direct.log)"
                fi
            else
                report "down sshfs-direct: socat did not listen"
            fi
        else
            report "down sshfs-direct: socat not installed"
        fi
    fi
}

stop() {
    STATE=$(cd "${1:?usage: stop STATE}" && pwd) || die "no state dir"
    for m in "$STATE/mnt-sshfs" "$STATE/mnt-sshfs-direct"; do
        if mountpoint -q "$m" 2>/dev/null; then
            fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
        fi
    done
    for name in sshfs sshfs-direct socat sshd smbd diod ganesha rpcbind; do
        f=$STATE/$name.pid
        [ -s "$f" ] || continue
        pid=$(cat "$f")
        if kill -0 "$pid" 2>/dev/null; then
            if [ "$name" = smbd ]; then
                # smbd made itself the leader of its own process group:
                # signal that group (smbd's own children), nothing else.
                kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
            else
                kill -TERM "$pid" 2>/dev/null
            fi
            i=0
            while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        fi
        rm -f "$f"
    done
    echo "baselines stopped"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
install) install ;;
clients) clients "$@" ;;
start) start "$@" ;;
stop) stop "$@" ;;
*) die "usage: $0 install | clients OUTDIR | start EXPORT STATE | stop STATE" ;;
esac
