#!/usr/bin/env bash
# GPU check for issue 33: ../shared/nccl/nccl_cases.py's `hang` case,
# three jobs of 4 NCCL ranks on one GPU, each rank started the way the admission webhook
# instruments a pod (no launcher; PYTHONPATH = the probe folder the init container writes;
# the webhook's env). Default stall settings. Writes summary.json (see the driver's docstring).
#
#   1. On the dev machine, once (needs ../shared and the venv):
#        scripts/gpu/instrument_check.sh prepare [CHECKOUT]   (default: this checkout)
#      -> CHECKOUT/.cache/gpu-instrument/ (ignored by git): nccl_cases.py copied from
#         ../shared/nccl, the driver, and `trainsentry probe install` output (hook, probe,
#         prometheus_client) exactly as the init container writes it.
#   2. On the device, from the checkout's root, carrying that folder:
#        run(command="bash .cache/gpu-instrument/run.sh", carry=[".cache/gpu-instrument"],
#            timeout_s=480)
#      About 3 minutes (three jobs at once; each ends 40 s after the watchdog's timeout).
#      Results: $OUT/gpu-instrument/summary.json and the per-job folders.
set -euo pipefail

if [[ "${1:-}" == "prepare" ]]; then
  here="$(cd "$(dirname "$0")" && pwd)"
  checkout="${2:-$(cd "$here/../.." && pwd)}"
  dest="$checkout/.cache/gpu-instrument"
  rm -rf "$dest" && mkdir -p "$dest"
  cp "$checkout/../shared/nccl/nccl_cases.py" "$dest/nccl_cases.py"
  cp "$here/instrument_check.py" "$dest/driver.py"
  (cd "$checkout" && PYTHONPATH="$checkout" "$checkout/.venv/bin/python" -m trainsentry probe install "$dest/probe")
  cat > "$dest/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device, from the checkout's root. OUT: the run tool's output folder.
set -uo pipefail
out="${OUT:-/tmp}/gpu-instrument"
mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
{ nvidia-smi -L; python3 --version; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'; } 2>&1 | tee "$out/env.txt"
# the hook needs Python >= 3.11 (the probe's requires-python); say so plainly if not
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 3)' || echo "PYTHON TOO OLD for the probe: the hook will say so and start nothing" | tee -a "$out/env.txt"
timeout 420 python3 "$here/driver.py" "$out" 2>&1 | tail -40
ls "$out"
RUN
  chmod +x "$dest/run.sh"
  echo "prepared $dest ($(du -sh "$dest" | cut -f1)); on the device: bash .cache/gpu-instrument/run.sh"
  exit 0
fi
echo "usage: $0 prepare [CHECKOUT]   (then run .cache/gpu-instrument/run.sh on the device)" >&2
exit 2
