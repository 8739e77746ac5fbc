#!/usr/bin/env bash
# Install what gpulaunch's demo or tests need on a Debian/Ubuntu machine, as root:
# system packages (pystemd builds against libsystemd), a virtual environment in
# .venv with gpulaunch (editable) and torch 2.13.0's CPU build; `unit` adds the
# test extra (pytest, ruff, mypy, Lightning, ...), enough for tests/unit; `test`
# (the default, what scripts/test.sh and CI run) adds to that Debian's Slurm
# (slurmd, slurmctld, slurm-client, munge) for the Slurm tests, qemu and
# debootstrap for the VM lab, dpkg-dev and debhelper for the .deb, strace.
# `demo` and `test` end with `gpulaunch setup`, which writes gpulaunch's D-Bus
# policy, gpulaunch.slice and its tmpfiles.d entry into this machine's /etc.
#
#   bash scripts/setup.sh demo   # gpulaunch + torch + numpy: about 220 MB to download, 1 GB installed
#   bash scripts/setup.sh unit   # gpulaunch + torch + the test extra: about 270 MB, 1.2 GB installed
#   bash scripts/setup.sh [test] # the above + Slurm, qemu, debootstrap, ... (about 70 MB more)
#
# A torch 2.13.0 that .venv or $PYTHON already has is used as it is (nothing is
# downloaded for it). Otherwise torch comes from PyTorch's CPU index
# ($TORCH_INDEX_URL, default https://download.pytorch.org/whl/cpu; set it empty
# to use your own pip index, where `torch==2.13.0` is the CUDA build, ~3 GB more).
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-test}
case "$WHAT" in
demo | unit | test) ;;
*)
    echo "setup: unknown target '$WHAT'; use demo, unit or test" >&2
    exit 2
    ;;
esac

PACKAGES=(
    libsystemd-dev pkg-config gcc python3-dev python3-venv  # pystemd's build
    systemd dbus dbus-user-session util-linux procps        # the throwaway systemd box
    man-db groff-base bash-completion                       # tests of the man page, completions
)
# The Slurm tests run a real Slurm (one slurmd per systemd box, tests/integration/slurm.py).
TEST_PACKAGES=(slurmd slurmctld slurm-client munge)
# The Debian package's build (packaging/debian/, tests/integration/test_deb.py).
TEST_PACKAGES+=(dpkg-dev debhelper)
# The VM lab (sdbox/vm/, tests/vm/): a Debian 12 image and qemu to boot it.
TEST_PACKAGES+=(debootstrap qemu-system-x86 qemu-utils e2fsprogs openssh-client)
# strace holds a start-up window open (tests/integration/test_start_windows.py).
TEST_PACKAGES+=(strace)

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root (apt-get and the systemd box need it), e.g. sudo $0" >&2
    exit 77
fi

if [ "$WHAT" = test ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Installed, never started here: munge, slurmctld and slurmd run only inside the
    # tests' boxes. policy-rc.d(8) keeps their packages from starting them on this
    # machine (a container without systemd would run their init scripts).
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
    [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
    [ "${status:-0}" -eq 0 ] || exit "$status"
fi

PYTHON=${PYTHON:-python3}
TORCH=2.13.0
has_torch() { "$1" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; }
if [ ! -x .venv/bin/python ]; then
    if has_torch "$PYTHON"; then
        echo "setup: creating .venv with $($PYTHON --version), using its torch $TORCH" >&2
        "$PYTHON" -m venv --system-site-packages .venv
    else
        echo "setup: creating .venv with $($PYTHON --version)" >&2
        "$PYTHON" -m venv .venv
    fi
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if has_torch .venv/bin/python; then
    echo "setup: torch $TORCH is installed" >&2
else
    index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
    echo "setup: installing torch $TORCH (CPU build, about 190 MB) from ${index:-your pip index}" >&2
    "${PIP[@]}" ${index:+--index-url "$index"} "torch==$TORCH"
fi
if [ "$WHAT" = demo ]; then
    # numpy (about 17 MB): torch warns "Failed to initialize NumPy" in every rank without it.
    "${PIP[@]}" -e . numpy
else
    "${PIP[@]}" -e '.[test]' # its torch==2.13.0 is the one above
fi
[ "$WHAT" != unit ] || exit 0 # the unit tests need nothing in /etc

# The system side, from the package itself: gpulaunch's D-Bus policy, so that the
# watcher of a system job (root) may own io.gpulaunch.job.* and anyone may read
# jobs (docs/dbus.md). Idempotent; it says what it changed.
.venv/bin/gpulaunch setup
