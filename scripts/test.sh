#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, lint, type-check, unit tests,
# then the integration tests against a real systemd (the host's, or a
# throwaway one the tests boot; they fail, never skip, if it cannot boot).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
