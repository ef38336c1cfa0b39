#!/usr/bin/env bash
# One device run: issue 33's injected-probe check and issue 35's extra real NCCL cases, at once.
set -uo pipefail
# Prepare first (on a machine with ../shared and .venv):
#   scripts/gpu/instrument_check.sh prepare && mkdir -p .cache/gpu-extra && cp scripts/gpu/nccl_extra_cases.py .cache/gpu-extra/
# then on the device, from the repo root: bash scripts/gpu/run_all.sh (carry .cache/gpu-instrument, .cache/gpu-extra)
export PYTHONUNBUFFERED=1
nvidia-smi -L
( OUT=/tmp/gi bash .cache/gpu-instrument/run.sh > /tmp/gi.log 2>&1 ) &
( PYTHONPATH=$PWD CASE_CARRY=$PWD timeout 400 python3 .cache/gpu-extra/nccl_extra_cases.py /tmp/extra ring ring_ar mismatch opmismatch groups2 tpdp crash > /tmp/extra.log 2>&1 ) &
wait
tar czf $OUT/gi.tgz -C /tmp gi gi.log
tar czf $OUT/extra.tgz -C /tmp extra extra.log
ls -la $OUT; du -sh /tmp/extra/* | head -20
cat /tmp/gi/gpu-instrument/summary.json | head -60
tail -15 /tmp/extra.log
