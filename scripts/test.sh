#!/usr/bin/env bash
# Installs everything the tests need, then runs the linters and the whole test suite.
# Safe to run twice. Extra arguments go to pytest (e.g. scripts/test.sh -k intake).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$PWD/.venv/bin:$PWD/.cache/bin:$PATH"
export HELM_BIN="$(scripts/get-helm.sh)"
echo "== ruff"; ruff check .
echo "== mypy"; mypy
echo "== pytest"
set +e
pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# 5 = no tests collected: treat as failure, a green run must have run tests.
exit $rc
