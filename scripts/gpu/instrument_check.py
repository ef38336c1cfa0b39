#!/usr/bin/env python3
"""GPU check for issue 33 (helper `instrument`): ../shared/nccl/nccl_cases.py with every rank
started the way the admission webhook instruments a pod: no launcher, no trainsentry on the
image's path; PYTHONPATH = the folder `trainsentry probe install` wrote (its start-up hook),
and the env the webhook's patch gives (TRAINSENTRY_PROBE=1, job, namespace, port, token,
POD_NAME, POD_IP, TRAINSENTRY_NODE, TRAINSENTRY_GATEWAY_URL). The gateway is a stand-in: a
stdlib HTTP server on loopback taking the probes' hang triggers (the real gateway's
dependencies are not on the device), so the figure is stall -> trigger; the card adds the
dump fetch and analysis measured on the CPU (bench/bench_hang_page.py).

Runs three `hang` jobs at once (rank 2 of 4 sleeps before all_reduce #20, one GPU, NCCL over
sockets, each rank its own NCCL_HOSTID), with the probe's default stall settings except the
no-history threshold, set to the 20 s floor (the stall comes ~1 s into training, before any
history; a trained job has the floor), and writes
OUT/summary.json:
  - stall -> first /status of a waiting rank showing the stalled all_reduce in flight
    (goal <= 5 s; issue 28's switch-only experiment saw 3.2 s), per job and median;
  - stall -> first hang trigger at the gateway stand-in, naming the stalled collective,
    per job and median (the fast path's detection and trigger under NCCL);
  - /dump during the hang (25 s after the stall): entries per rank (non-empty?);
  - the ranks' hook lines ("trainsentry: probe started for rank ...").

Layout (made by instrument_gpu_check.sh prepare, in the checkout's ignored .cache/):
  .cache/gpu-instrument/nccl_cases.py   copy of ../shared/nccl/nccl_cases.py
  .cache/gpu-instrument/driver.py       this file
  .cache/gpu-instrument/probe/          `trainsentry probe install` output (hook + probe +
                                        prometheus_client), as the init container writes it

Usage (repo root, device):  python3 .cache/gpu-instrument/driver.py OUT
Worker mode (internal):     python3 .cache/gpu-instrument/driver.py --worker CASE DIR
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "probe")
JOBS = ("hang_a", "hang_b", "hang_c")  # three copies of nccl_cases' `hang`
sys.path.insert(0, HERE)
import nccl_cases as nc  # noqa: E402  (the copy next to this file)

for _alias in JOBS:
    nc.CASES[_alias] = dict(nc.CASES["hang"])


def worker(case: str, outdir: str) -> None:
    """One rank: nccl_cases' own worker, which imports trainsentry.probe only in a try (the
    hook's copy now answers it) and calls probe.step()."""
    nc.worker(case, outdir)


class Triggers:
    """The gateway stand-in: records every hang trigger with its arrival time."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        triggers = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0") or 0)
                body = json.loads(self.rfile.read(min(length, 65536)) or b"{}")
                triggers.seen.append(
                    {
                        "at": time.time(),
                        "path": self.path,
                        "auth": bool(self.headers.get("Authorization")),
                        **body,
                    }
                )
                self.send_response(202)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def webhook_env(env: dict, case_dir: str, gateway: str) -> dict:
    """The harness's rank env, turned into what an instrumented pod's container gets: the
    launcher's PYTHONPATH (the checkout) replaced by the hook's folder; torch's dump settings
    left to the probe (the webhook sets none; the dump folder is the pod's emptyDir, here a
    folder of the case); the webhook's variables added."""
    env = dict(env)
    for key in (
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "PYTHONPATH",
    ):
        env.pop(key, None)
    env.update(
        PYTHONPATH=os.path.join(PROBE, "bootstrap"),
        TRAINSENTRY_PROBE="1",
        TRAINSENTRY_GATEWAY_URL=gateway,
        TRAINSENTRY_FR_DUMP_DIR=os.path.join(case_dir, "fr"),
        POD_IP="127.0.0.1",
        # nccl_cases' `hang` stops at step 20, ~1-2 s into training: before the 5 finished
        # waits the adaptive threshold needs, so the no-history threshold (300 s by default)
        # would apply. Set it to the floor (20 s), the threshold a trained job gets.
        TRAINSENTRY_PROBE_STALL_STARTUP="20",
    )
    return env


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    triggers = Triggers()
    real_popen = subprocess.Popen

    def popen(argv: list, env: dict | None = None, **kw: object) -> subprocess.Popen:
        if argv[1:3] == ["-m", "trainsentry.probe.launch"]:  # a rank: no launcher
            case, case_dir = argv[-2], argv[-1]
            argv = [argv[0], os.path.abspath(__file__), "--worker", case, case_dir]
            env = webhook_env(env or {}, case_dir, triggers.url)
        return real_popen(argv, env=env, **kw)

    nc.subprocess = types.SimpleNamespace(Popen=popen, STDOUT=subprocess.STDOUT)
    sys.argv = [nc.__file__, out, *JOBS]
    os.environ.setdefault("CASE_PG_TIMEOUT_S", "40")
    nc.TIMEOUT_S = int(os.environ["CASE_PG_TIMEOUT_S"])
    started = time.time()
    nc.main()
    summary = {"seconds": round(time.time() - started, 1), "jobs": {}}
    for job in JOBS:
        d = os.path.join(out, job)
        row: dict = {}
        try:
            stall = float(open(os.path.join(d, "stall_at")).read())
        except (OSError, ValueError):
            summary["jobs"][job] = {"error": "no stall_at"}
            continue
        seen_at = None
        with open(os.path.join(d, "polls.jsonl")) as polls:
            for line in polls:
                poll = json.loads(line)
                if poll["t"] < stall:
                    continue
                for rank, item in poll["ranks"].items():
                    if rank == "2":
                        continue
                    groups = (item.get("status") or {}).get("process_groups") or {}
                    if any((g.get("in_flight") or {}).get("seq") == 20 for g in groups.values()):
                        seen_at = poll["t"]
                        break
                if seen_at is not None:
                    break
        row["stall_to_status_s"] = None if seen_at is None else round(seen_at - stall, 2)
        mine = [t for t in triggers.seen if t.get("trainingjob") == job and not t.get("resolved")]
        row["triggers"] = len(mine)
        row["stall_to_trigger_s"] = round(min(t["at"] for t in mine) - stall, 2) if mine else None
        row["trigger"] = (
            {
                k: mine[0].get(k)
                for k in ("rank", "pg", "seq", "op", "waited_s", "threshold_s", "auth")
            }
            if mine
            else None
        )
        entries = {}
        for rank in range(4):
            try:
                doc = json.load(open(os.path.join(d, f"probe_dump_{rank}.json")))
                entries[rank] = (
                    len(doc.get("entries") or []) if "entries" in doc or "pg_status" in doc else doc
                )
            except (OSError, ValueError) as exc:
                entries[rank] = repr(exc)
        row["dump_entries_25s_after_stall"] = entries
        hooks = []
        for rank in range(4):
            try:
                text = open(os.path.join(d, f"rank{rank}.log"), errors="replace").read()
            except OSError:
                text = ""
            hooks += [ln for ln in text.splitlines() if ln.startswith("trainsentry:")]
        row["hook_lines"] = hooks
        summary["jobs"][job] = row
    status = [
        r["stall_to_status_s"]
        for r in summary["jobs"].values()
        if r.get("stall_to_status_s") is not None
    ]
    trig = [
        r["stall_to_trigger_s"]
        for r in summary["jobs"].values()
        if r.get("stall_to_trigger_s") is not None
    ]
    summary["median_stall_to_status_s"] = statistics.median(status) if status else None
    summary["median_stall_to_trigger_s"] = statistics.median(trig) if trig else None
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "jobs"}), flush=True)
    for job, row in summary["jobs"].items():
        print(job, json.dumps({k: v for k, v in row.items() if k != "hook_lines"}), flush=True)
        print(job, "hook:", (row.get("hook_lines") or ["(no hook line)"])[:4], flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "gpu-instrument-out")
