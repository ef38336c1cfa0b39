#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, and nothing twice:
# Debian packages (Prometheus, Alertmanager, promtool, Chromium), a running PostgreSQL,
# a virtualenv in .venv with trainsentry[test,probe] at the versions of constraints.txt, and
# helm under .cache/bin.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# The Debian packages start their own services under systemd; we run our own instances.

if command -v pg_isready >/dev/null && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "install-deps: starting PostgreSQL"
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.trainsentry-deps
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first and pinned: 2.13.0 is a CPU build on local disk; a looser spec pulls CUDA.
  .venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0"
  # constraints.txt: the exact versions tested together, so a new release of a dependency
  # (or of ruff and mypy) cannot turn a fresh machine's run red on its own.
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[test,probe]"
  touch "$stamp"
fi

scripts/get-helm.sh >/dev/null
