#!/bin/sh
# PID 1 of the box's fresh namespaces (started by sdbox/box.py under `unshare`):
# build the box's root, then become systemd (how and why: sdbox/box.py's docstring).
#
# Usage: inner.sh STATE_DIR HOSTNAME [BIND...] -- SYSTEMD_ARGV...
#   STATE_DIR/root/  files copied into the box's root before boot
#   STATE_DIR/mnt/   mount point for the box's private tmpfs (upper layer, work dir, root)
#
# Everything mounted here lives only in this (private) mount namespace.
set -eu

state=$1
hostname=$2
shift 2

mnt=$state/mnt
root=$mnt/root

# An overlay of the host's root: writes land in a tmpfs, the host's files stay untouched.
mount -t tmpfs -o mode=0755 sdbox "$mnt"
mkdir "$mnt/upper" "$mnt/work" "$root"
mount -t overlay -o "lowerdir=/,upperdir=$mnt/upper,workdir=$mnt/work" sdbox "$root"
cp -a "$state/root/." "$root/"

mount -t proc proc "$root/proc"
# Read-only /proc/sys and /sys, as systemd-nspawn does: the box shares the host's kernel.
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount --rbind /sys "$root/sys"
mount -o remount,bind,ro "$root/sys"
# A cgroup2 over the v1 layout, so systemd runs unified; rooted at the box's cgroup
# because this process entered a new cgroup namespace there (cgroup_namespaces(7)).
mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup"

# A /dev of the box's own, as systemd-nspawn makes: systemd creates symlinks, mount
# points and nodes in /dev (journald's /dev/log, /dev/hugepages, ...), and the host's
# devtmpfs must never see them. Host nodes the box needs are bind-mounted one by one;
# no /dev/console: systemd then logs only to the journal.
mount -t tmpfs -o mode=0755,nosuid sdbox "$root/dev"
for src in /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty \
    /dev/nvidia* /dev/dri; do
    [ -e "$src" ] || continue
    if [ -d "$src" ]; then mkdir "$root$src"; else : >"$root$src"; fi
    mount --rbind "$src" "$root$src"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev sdbox "$root/dev/shm"

# Fresh /run, /tmp and journal: systemd-tmpfiles empties /tmp at boot (tmpfiles.d(5), "D").
mount -t tmpfs -o mode=0755,nosuid,nodev sdbox "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev sdbox "$root/tmp"
mkdir -p "$root/var/log/journal"
mount -t tmpfs -o mode=2755,nosuid,nodev sdbox "$root/var/log/journal"

while [ "$1" != "--" ]; do
    if [ -d "$1" ]; then
        mkdir -p "$root$1"
    else
        mkdir -p "$root$(dirname "$1")"
        [ -e "$root$1" ] || : >"$root$1"
    fi
    mount --rbind "$1" "$root$1"
    shift
done
shift

hostname "$hostname"

cd "$root"
pivot_root . .
umount -l .
cd /

# Belt and braces: never boot where /run or /tmp could be the host's (systemd-tmpfiles
# empties /tmp). After pivot_root every mount point here is one this script made.
if ! mountpoint -q /run || ! mountpoint -q /tmp; then
    echo "sdbox: /run or /tmp is not the box's own tmpfs; not booting" >&2
    exit 1
fi

export container=sdbox
exec "$@"
