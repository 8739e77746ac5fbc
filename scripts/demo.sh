#!/usr/bin/env bash
# The quick-start demo: install, then run the 4-rank DDP example twice under
# gpulaunch: once succeeding, once with rank 2 failing in step 10 while the
# other ranks wait in an all-reduce. Uses the host's systemd where one runs,
# else a throwaway systemd in private namespaces (sdbox).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit

cat <<'TXT' >&2

== 1/2: 4 ranks of examples/ddp_train.py, all succeed ==
TXT
.venv/bin/python -m sdbox run -- .venv/bin/gpulaunch start --nproc 4 --job demo-ok \
    examples/ddp_train.py --steps 30

cat <<'TXT' >&2

== 2/2: rank 2 raises in step 10; the others are stopped at once, not after the 30-minute collective timeout ==
TXT
.venv/bin/python -m sdbox run -- .venv/bin/gpulaunch start --nproc 4 --job demo-fail \
    examples/ddp_train.py --steps 200 --step-sleep 0.05 --fail-rank 2 --fail-step 10
status=$?
echo "gpulaunch exited with status $status (rank 2's exit code)" >&2
[ "$status" -eq 1 ]
