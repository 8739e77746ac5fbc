#!/usr/bin/env bash
# The quick-start demo: install, then run the 4-rank DDP example twice under
# gpulaunch: once succeeding, once with rank 2 failing in step 10 while the
# other ranks wait in an all-reduce. Uses the host's systemd where one runs,
# else a throwaway systemd in private namespaces (sdbox). Stops at the first
# step that fails, saying which.
set -uo pipefail
cd "$(dirname "$0")/.."
# The throwaway systemd mounts /tmp, /run, ... afresh: a checkout there cannot be
# bound into it. Run a copy instead (as scripts/test.sh does), kept for next time
# (with its .venv) in $GPULAUNCH_DEMO_COPY (default /var/tmp/gpulaunch-demo-UID).
hidden() {
    case "$1/" in
    /tmp/* | /run/* | /dev/* | /proc/* | /sys/*) return 0 ;;
    *) return 1 ;;
    esac
}
if hidden "$(pwd -P)"; then
    copy=${GPULAUNCH_DEMO_COPY:-/var/tmp/gpulaunch-demo-$(id -u)}
    if hidden "$copy"; then
        echo "demo: GPULAUNCH_DEMO_COPY=$copy is under $(echo "$copy" | cut -d/ -f2)/ too; choose another place" >&2
        exit 2
    fi
    echo "demo: this checkout is under $(pwd -P | cut -d/ -f2)/, which the box mounts afresh; running a copy in $copy" >&2
    mkdir -p "$copy" || exit
    tar --exclude=./.venv --exclude=./.it-tmp -cf - . | tar -xf - -C "$copy" || exit
    exec bash "$copy/scripts/demo.sh" "$@"
fi
fail() {
    echo "demo: $1; stopped here (the lines above say why)" >&2
    exit 1
}
bash scripts/setup.sh demo || fail "installing failed"  # gpulaunch and torch only

cat <<'TXT' >&2

== 1/2: 4 ranks of examples/ddp_train.py, all succeed ==
TXT
.venv/bin/python -m sdbox run -- .venv/bin/gpulaunch start --nproc 4 --job demo-ok \
    examples/ddp_train.py --steps 30 || fail "part 1 did not succeed (exit status $?)"

cat <<'TXT' >&2

== 2/2: rank 2 raises in step 10; the others are stopped at once, not after the 30-minute collective timeout ==
TXT
# The job's record (gpulaunch status --json), read in the same box, says what ended it.
record=$(mktemp -p . .demo-record.XXXXXX) || exit
trap 'rm -f "$record"' EXIT
.venv/bin/python -m sdbox run -- sh -c '"$@"; s=$?; .venv/bin/gpulaunch status --json demo-fail >"$0"; exit $s' \
    "$record" .venv/bin/gpulaunch start --nproc 4 --job demo-fail \
    examples/ddp_train.py --steps 200 --step-sleep 0.05 --fail-rank 2 --fail-step 10
status=$?
.venv/bin/python - "$status" "$record" <<'PY' >&2
import json, sys
status, path = int(sys.argv[1]), sys.argv[2]
try:
    with open(path) as f:
        job = json.load(f)
except (OSError, ValueError):
    job = {}
if job.get("cause") == "rank-failed" and job.get("status") == status:
    print(f"gpulaunch exited with status {status} (rank {job['cause_rank']}'s exit status)")
elif not job:
    print(f"demo: part 2 ended with status {status} and left no job record; stopped here")
    sys.exit(1)
else:
    print(f"demo: part 2 ended with status {status}: the job {job.get('state')}, cause "
          f"{job.get('cause')} (not rank 2's failure)")
    sys.exit(1)
PY
[ $? -eq 0 ] && [ "$status" -eq 1 ] && grep -q '"cause_rank": 2' "$record"
