#!/usr/bin/env bash
# Installs everything the tests need, then runs the linters and the whole test suite.
# Safe to run twice. Extra arguments go to pytest (e.g. scripts/test.sh -k intake).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$PWD/.venv/bin:$PWD/.cache/bin:$PATH"
export HELM_BIN="$(scripts/get-helm.sh)"
# Run every check even when one fails, so one CI run shows every problem; fail at the end.
failed=()
echo "== ruff"; ruff check . || failed+=(ruff)
echo "== ruff format"; ruff format --check . || failed+=(ruff-format)
echo "== mypy"; mypy || failed+=(mypy)
echo "== pytest"
# pytest's exit 5 (no tests collected) counts as a failure too: a green run must run tests.
pytest -q -p no:cacheprovider --durations=15 "$@" || failed+=(pytest)
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
