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
# pytest in two runs, both always run. First every test that runs in-process, on two workers
# (pytest-xdist; tests/support/xdist_scheduling.py says which tests share one). Then, one at a
# time, the tests that start real servers or torch ranks (markers `e2e`, `torch`): their
# timings must not compete with a second worker for the CPUs.
# pytest's exit 5 (no tests collected) counts as a failure too: a green run must run tests.
# With extra arguments (`-k intake`) one run may select nothing; then only both count.
ran_none=0
phase() {
  local name=$1 rc=0
  shift
  echo "== pytest ($name)"
  pytest -q -p no:cacheprovider --durations=15 "$@" || rc=$?
  if [ "$rc" = 5 ]; then
    ran_none=$((ran_none + 1))
    if [ "$extra" = 0 ]; then failed+=("pytest-$name"); fi
  elif [ "$rc" != 0 ]; then
    failed+=("pytest-$name")
  fi
}
extra=$#
phase parallel -n 2 -m "not e2e and not torch" "$@"
phase serial -m "e2e or torch" "$@"
if [ "$ran_none" = 2 ]; then failed+=(pytest-no-tests); fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
