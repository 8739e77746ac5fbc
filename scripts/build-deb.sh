#!/usr/bin/env bash
# Build gpulaunch's .deb (packaging/debian/) from this checkout, as CI does:
#
#   bash scripts/build-deb.sh [OUTDIR]     # default OUTDIR: dist/
#
# Needs dpkg-dev, debhelper, python3-venv, and the package index for the dependencies'
# wheels (or PIP_FIND_LINKS/--no-index set up by the caller). PYTHON (default .venv's, else
# python3) builds gpulaunch's wheel, as `python -m build --no-isolation` (hatchling >= 1.27);
# the dependencies' wheels are built for Debian's /usr/bin/python3, which the package runs.
# The tree is copied (tracked and untracked-but-not-ignored files), so the checkout stays
# clean. Prints the .deb's path.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
OUT=$(realpath -m "${1:-$REPO/dist}")
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
say() { echo "build-deb: $*" >&2; }

WORK=$(mktemp -d -t gpulaunch-deb.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SRC=$WORK/gpulaunch-0.1.0
mkdir -p "$SRC" "$WORK/wheels" "$OUT"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$SRC"
cp -r packaging/debian "$SRC/debian"

start=$(date +%s)
"$PYTHON" -m build --no-isolation --wheel --outdir "$WORK/wheels" "$SRC" >"$WORK/build.log" 2>&1 ||
    { tail -n 20 "$WORK/build.log" >&2; say "building the wheel failed"; exit 1; }
/usr/bin/python3 -m venv "$WORK/pip"
"$WORK/pip/bin/pip" wheel -q --disable-pip-version-check --wheel-dir "$WORK/wheels" \
    "$WORK"/wheels/gpulaunch-*.whl
(cd "$SRC" && GPULAUNCH_WHEELS=$WORK/wheels dpkg-buildpackage -b -us -uc >"$WORK/deb.log" 2>&1) ||
    { tail -n 30 "$WORK/deb.log" >&2; say "dpkg-buildpackage failed"; exit 1; }
cp "$WORK"/gpulaunch_*.deb "$OUT/"
say "built in $(($(date +%s) - start)) s"
ls "$OUT"/gpulaunch_*.deb
