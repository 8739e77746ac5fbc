#!/usr/bin/env bash
# The GPU checks (tests/gpu, issue 18) in one go, offline, on a GPU machine:
#
#   bash scripts/test-gpu.sh             # on the GPU machine, as root: about 2-4 minutes
#                                        # (without a GPU: to the end, GPU checks not applicable)
#   bash scripts/test-gpu.sh --cpu-only  # anywhere: everything but touching a GPU (CI runs it)
#   bash scripts/test-gpu.sh --prepare   # here, with the package index: fill .gpu-wheels/
#
# It uses the machine's python (PYTHON, default python3, >= 3.11) in a venv
# (GPU_VENV, default .venv-gpu) made with --system-site-packages, so a CUDA torch
# installed there is used; it installs nothing from a network. gpulaunch comes from this
# checkout (a .pth file); what the machine lacks (jinja2, psutil, dbus-fast,
# nvidia-ml-py, pytest, pystemd and lxml) comes from .gpu-wheels/ (gitignored; made by
# --prepare, carried with the checkout). pystemd has no wheel on PyPI: it is built from
# its sdist (C files included, no Cython) and needs gcc, pkg-config, libsystemd-dev and
# Python.h; where it cannot be built, the checks that run jobs are reported not
# applicable and the inventory and device checks still run. Where systemd is not
# PID 1, the checks boot the project's box (sdbox). Findings go to
# bench/results/gpu-<date>.md (--cpu-only: bench/.scratch/gpu-cpu-only.md), or GPU_RESULTS.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
say() { echo "test-gpu: $*" >&2; }

MODE=gpu
case "${1:-}" in
--cpu-only) MODE=cpu; shift ;;
--prepare) MODE=prepare; shift ;;
esac
WHEELS=${GPU_WHEELS:-$REPO/.gpu-wheels}
PYTHON=${PYTHON:-python3}

if [ "$MODE" = prepare ]; then
    # Pure-Python wheels, psutil (abi3), pystemd's sdist and its build tools, and the
    # compiled wheels (lxml, markupsafe, dbus-fast) for each CPython gpulaunch supports.
    mkdir -p "$WHEELS"
    pip=("$PYTHON" -m pip download -q --disable-pip-version-check --no-deps -d "$WHEELS")
    "${pip[@]}" jinja2 nvidia-ml-py pytest pluggy iniconfig packaging setuptools wheel
    "${pip[@]}" --no-binary pystemd 'pystemd==0.15.3'  # its build tools as wheels: fast
    for v in 3.11 3.12 3.13; do
        "${pip[@]}" --only-binary :all: --python-version "$v" --implementation cp \
            --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 psutil lxml markupsafe dbus-fast ||
            say "no wheels for CPython $v"
    done
    say "$(ls "$WHEELS" | wc -l) files, $(du -sh "$WHEELS" | cut -f1) in $WHEELS"
    exit 0
fi

case "$REPO/" in
/tmp/* | /run/* | /dev/* | /proc/* | /sys/*)
    say "this checkout is under $(echo "$REPO" | cut -d/ -f2)/, which the box replaces; move it (e.g. to /var/tmp)"
    exit 2
    ;;
esac
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    say "$PYTHON is missing or older than 3.11; set PYTHON=/path/to/python3.11+"
    exit 2
fi

NOTES=$(mktemp)
FINDINGS=$(mktemp)
trap 'rm -f "$NOTES" "$FINDINGS"' EXIT
note() { say "$*"; echo "$*" >>"$NOTES"; }

# -- the environment: the machine's python, this checkout, wheels that travelled with it
VENV=${GPU_VENV:-$REPO/.venv-gpu}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
fi
PY=$VENV/bin/python
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$REPO" >"$SITE/gpulaunch-checkout.pth"
if [ ! -x "$VENV/bin/gpulaunch" ]; then
    printf '#!%s\nimport sys\nfrom gpulaunch.cli import main\nsys.exit(main())\n' "$PY" >"$VENV/bin/gpulaunch"
    chmod +x "$VENV/bin/gpulaunch"
fi
note "python: $("$PY" --version 2>&1) in $VENV (system site-packages: $("$PYTHON" -c 'import sys; print(sys.prefix)'))"

has() { "$PY" -c "import $1" 2>/dev/null; }
install_wheels() { # install PACKAGES from the carried wheels; 0 if it worked
    [ -d "$WHEELS" ] && "$PY" -m pip --version >/dev/null 2>&1 &&
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps \
            --no-build-isolation --find-links "$WHEELS" "$@" >"$NOTES.pip" 2>&1
}
missing=()
for pair in jinja2:markupsafe,jinja2 psutil:psutil dbus_fast:dbus-fast pynvml:nvidia-ml-py \
    pytest:iniconfig,packaging,pluggy,pytest; do
    module=${pair%%:*}
    has "$module" && continue
    IFS=, read -r -a pkgs <<<"${pair#*:}"
    install_wheels "${pkgs[@]}" || true
    has "$module" || missing+=("$module")
done
if ! has pystemd.dbuslib; then
    why=""
    command -v gcc >/dev/null || why="no gcc"
    pkg-config --exists libsystemd 2>/dev/null || why="${why:+$why, }no libsystemd-dev (pkg-config libsystemd)"
    "$PY" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' ||
        why="${why:+$why, }no Python.h (python3-dev)"
    ls "$WHEELS"/pystemd-*.tar.gz >/dev/null 2>&1 || why="${why:+$why, }no pystemd sdist in $WHEELS (run --prepare where the index is)"
    if [ -z "$why" ]; then
        # The carried setuptools, even where the machine has one: pystemd's pyproject.toml
        # needs a recent one (a license string, PEP 639), older ones refuse it.
        install_wheels --upgrade setuptools wheel || true
        has lxml || install_wheels lxml || true
        install_wheels "$WHEELS"/pystemd-*.tar.gz || why="its build failed: $(tail -n 1 "$NOTES.pip")"
        has pystemd.dbuslib || why=${why:-"it does not import: $("$PY" -c 'import pystemd.dbuslib' 2>&1 | tail -n 1)"}
    fi
    [ -n "$why" ] && note "pystemd could not be installed offline ($why): the checks that run jobs are not applicable; inventory and device checks run"
fi
rm -f "$NOTES.pip"
if [ "${#missing[@]}" -gt 0 ]; then
    note "missing and not in $WHEELS: ${missing[*]} (run --prepare where the index is, and carry .gpu-wheels/)"
    has pytest || exit 2
fi

# -- systemd: the host's, or the box the checks boot
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && [ -d /run/systemd/system ]; then
    note "systemd: the host's (PID 1)"
    if [ "$(id -u)" -eq 0 ] && [ "$MODE" = gpu ]; then
        # What an admin would run: gpulaunch setup, from this checkout's packaging/. A failure
        # is noted, not fatal: jobs run without the job API (the checks say what they miss).
        # --cpu-only runs no job: it leaves the machine's /etc alone.
        if setup=$("$VENV/bin/gpulaunch" setup 2>&1); then
            while IFS= read -r line; do note "$line"; done <<<"$setup"
        else
            note "gpulaunch setup failed (the checks run without it): $(tail -n 1 <<<"$setup")"
        fi
    fi
else
    note "systemd: not PID 1 here; the checks boot the project's box (sdbox)"
fi

# -- the checks
export GPULAUNCH_GPU_FINDINGS=$FINDINGS
if [ "$MODE" = cpu ]; then
    # Never touch a GPU: the gate sees an empty driver tree, every GPU check is not applicable.
    GPULAUNCH_GPU_PROC=$(mktemp -d -t cpu-only-no-gpu.XXXXXX)
    export GPULAUNCH_GPU_PROC
    RESULTS=${GPU_RESULTS:-$REPO/bench/.scratch/gpu-cpu-only.md}
else
    # No GPU found: every GPU check is not applicable and the run still goes to its end (the
    # findings page says why). GPULAUNCH_REQUIRE_GPU=1 makes that an error instead (exit 4).
    NO_GPU=$("$PY" -c 'from tests.gpu.gate import probe_gpu; print(probe_gpu() or "")' 2>&1) ||
        NO_GPU="the GPU probe failed: $(tail -n 1 <<<"$NO_GPU")"
    [ -n "$NO_GPU" ] && note "no NVIDIA GPU here ($NO_GPU): the GPU checks are not applicable"
    RESULTS=${GPU_RESULTS:-$REPO/bench/results/gpu-$(date +%F).md}
fi
ulimit -n 1024
set +e
timeout 280 "$PY" -m pytest -p no:cacheprovider -v -rA tests/gpu "$@"
status=$?
set -e
[ "$status" -eq 124 ] && note "the checks ran over 280 s and were stopped"
# --cpu-only, or no GPU: every check is not applicable, so pytest ran none (exit 5).
[ "$status" -eq 5 ] && { [ "$MODE" = cpu ] || [ -n "${NO_GPU:-}" ]; } && status=0
[ "$MODE" = cpu ] && rmdir "$GPULAUNCH_GPU_PROC"
mkdir -p "$(dirname "$RESULTS")"
if [ -s "$FINDINGS" ]; then
    "$PY" -m tests.gpu.findings "$FINDINGS" "$NOTES" >"$RESULTS"
    say "findings in $RESULTS"
else
    say "no findings written (pytest exit $status)"
fi
exit "$status"
