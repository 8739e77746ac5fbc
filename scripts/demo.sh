#!/usr/bin/env bash
# The quick-start demo: install, then run the 4-rank DDP example twice under
# gpulaunch: once succeeding, once with rank 2 failing in step 10 while the
# other ranks wait in an all-reduce. Uses the host's systemd where one runs,
# else a throwaway systemd in private namespaces (sdbox).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo || exit  # gpulaunch and torch only

cat <<'TXT' >&2

== 1/2: 4 ranks of examples/ddp_train.py, all succeed ==
TXT
.venv/bin/python -m sdbox run -- .venv/bin/gpulaunch start --nproc 4 --job demo-ok \
    examples/ddp_train.py --steps 30

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
    why = f"rank {job['cause_rank']}'s exit status"
else:
    why = f"the job {job.get('state', 'left no record')}, cause {job.get('cause')}"
print(f"gpulaunch exited with status {status} ({why})")
PY
[ "$status" -eq 1 ] && grep -q '"cause_rank": 2' "$record"
