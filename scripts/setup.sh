#!/usr/bin/env bash
# Install what gpulaunch's demo and tests need on a Debian/Ubuntu machine, as root:
# system packages (pystemd builds against libsystemd), a virtual environment in
# .venv with gpulaunch (editable), its test extra and torch 2.13.0 (CPU).
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
    libsystemd-dev pkg-config gcc python3-dev python3-venv  # pystemd's build
    systemd dbus dbus-user-session util-linux procps        # the throwaway systemd box
    man-db groff-base bash-completion                       # tests of the man page, completions
)

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root (apt-get and the systemd box need it), e.g. sudo $0" >&2
    exit 77
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PYTHON --version)" >&2
    "$PYTHON" -m venv .venv
fi
# torch is pinned to the 2.13.0 CPU build in the test extra; a bare `torch`
# would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

# The system side, from the package itself: gpulaunch's D-Bus policy, so that the
# watcher of a system job (root) may own io.gpulaunch.job.* and anyone may read
# jobs (docs/dbus.md). Idempotent; it says what it changed.
.venv/bin/gpulaunch setup
