#!/usr/bin/env bash
# Re-resolves the newest dependency versions the package's ranges allow, in a throw-away venv,
# and writes them to constraints.txt: the versions CI, the demo and the image install. Run it
# when pyproject.toml's dependencies change or to take upgrades, then run scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip
"$tmp/venv/bin/python" -m pip install -q "torch==2.13.0"
"$tmp/venv/bin/python" -m pip install -q ".[test,probe]"
{
  echo "# Exact versions of every dependency, tested together (scripts/update-constraints.sh)."
  echo "# The package itself keeps ranges (pyproject.toml); these pin CI, the demo and the image."
  # A local version label (torch's +cpu) names one build; the version is what we pin.
  "$tmp/venv/bin/python" -m pip freeze --all --exclude trainsentry --exclude pip | sed -E 's/\+[A-Za-z0-9.]+$//' | LC_ALL=C sort -f
} > constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) pins)"
