#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, lint, type-check, unit tests,
# then the integration tests against a real systemd (the host's, or a
# throwaway one the tests boot; they fail, never skip, if it cannot boot),
# then tests/vm in the VM lab (a Debian 12 VM with every cgroup controller,
# real SSH logins, podman: sdbox/vm/README.md), whose image is built once per
# machine and cached; they error, never skip, if it cannot be built or booted.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests bind this checkout into a throwaway systemd whose /tmp and /run are
# fresh (and cleaned at its boot): a checkout there must not be bound. Test a
# copy instead.
case "$(pwd -P)/" in
/tmp/* | /run/* | /dev/* | /proc/* | /sys/*)
    copy=/var/tmp/gpulaunch-test-$(id -u)
    echo "test: this checkout is under $(pwd -P | cut -d/ -f2)/, testing a copy in $copy" >&2
    mkdir -p "$copy"
    tar --exclude=./.venv --exclude=./.it-tmp -cf - . | tar -xf - -C "$copy"
    exec bash "$copy/scripts/test.sh" "$@"
    ;;
esac
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The layers of gpulaunch/ (pyproject.toml [tool.importlinter]; docs/architecture.md).
.venv/bin/lint-imports
# Where users are: a login shell's soft limit on open files is 1024 (systemd's
# default); the hard one stays. Everything, the box included, runs under it.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -ge 1024 ]; then ulimit -Sn 1024; fi
# The slowest tests, named in every run: what the README says a run costs comes from here.
pytest=(.venv/bin/python -m pytest -p no:cacheprovider --durations=30)
if [ "$#" -gt 0 ]; then exec "${pytest[@]}" "$@"; fi
# The whole suite: the VM lab (tests/vm: mostly a qemu guest's own CPU time and its boot)
# runs beside the rest (mostly waiting on systemd, journald and processes) instead of after
# it: README, "What a whole run costs". Its output follows the rest's.
vmlog=$(mktemp /var/tmp/gpulaunch-vm-lab.XXXXXX)
"${pytest[@]}" tests/vm >"$vmlog" 2>&1 &
vm=$!
rest=0
"${pytest[@]}" tests/unit tests/integration tests/gpu || rest=$?
lab=0
wait "$vm" || lab=$?
echo "=== tests/vm (the VM lab, run beside the above) ==="
cat "$vmlog"
rm -f "$vmlog"
if [ "$rest" -ne 0 ]; then exit "$rest"; fi
exit "$lab"
