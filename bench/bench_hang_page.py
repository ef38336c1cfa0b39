"""Stall → card naming the rank, on default settings: the fast hang path end to end.

Each run: the Feishu contract server (a custom bot with a signing secret, as Feishu
documents it), the real gateway (a subprocess, SQLite, `diagnosis:` with the job's probes as
static endpoints) and a real 4-rank gloo job started through the probe's launcher with the
probe's defaults (2 s polls, stall floor 20 s, factor 10, start-up 300 s) and
`TRAINSENTRY_GATEWAY_URL`. After `--train` seconds of training, rank 2 stops in its data
loader before an all_reduce its peers enter. Measured: from the moment rank 2 stops (it
writes the time first) to the first card at the Feishu server whose text names rank 2.

Baseline in the same run: the stall threshold itself (the 20 s floor once the group has
history), so the report also shows what the path adds after the threshold: detection,
trigger, dumps, stacks, analysis, send.

    .venv/bin/python -m bench.bench_hang_page [--runs 3] [--train 30] [--injected]

`--injected`: the same stall on the installed path instead (tests/support/install_scenario.py):
the chart rendered by helm, the gateway and the operator run with its objects, a PyTorchJob's
4 pods admitted through the operator's webhook and run with exactly the env, volumes and
PYTHONPATH it gave (the probe copied in by the init container's command), a training script
with no trainsentry import and no launcher, in an image stand-in without trainsentry; the
card goes to the Feishu contract server through the chart's bot settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[1]

from tests.support.feishu_server import FeishuContractServer, Hook  # noqa: E402

WORKER = REPO / "tests" / "probe" / "train_worker.py"
WORLD = 4
STALLED = 2
TOKEN = "bench-probe-token"
SECRET = "bench-bot-secret"


class Feishu:
    """The contract server on its own event loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FeishuContractServer(hooks={"critical": Hook(secret=SECRET)})
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def cards(self) -> list[str]:
        return [json.dumps(body) for _, body in list(self.server.accepted["critical"])]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def start_gateway(tmp: Path, feishu: Feishu, probe_ports: list[int]) -> tuple[Any, str]:
    port = free_port()
    config = tmp / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "channels": {
                    "feishu_bot": {
                        "groups": {
                            "critical": {
                                "priorities": ["P0", "P1"],
                                "url_env": "BOT_CRITICAL_URL",
                                "secret_env": "BOT_CRITICAL_SECRET",
                            }
                        }
                    }
                },
                "diagnosis": {
                    "static_endpoints": {"team-a/llama": [f"127.0.0.1:{p}" for p in probe_ports]}
                },
            }
        )
    )
    env = {
        **os.environ,
        "BOT_CRITICAL_URL": feishu.server.hook_url("critical"),
        "BOT_CRITICAL_SECRET": SECRET,
        "TRAINSENTRY_PROBE_TOKEN": TOKEN,
        "TRAINSENTRY_WEBHOOK_TOKEN": "bench-webhook-token",
        "PYTHONPATH": str(REPO),
    }
    argv = [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"127.0.0.1:{port}"]
    argv += ["--db", f"sqlite:///{tmp / 'gateway.db'}", "--config", str(config)]
    log = (tmp / "gateway.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("gateway did not start: " + (tmp / "gateway.log").read_text()[-2000:])


def start_job(tmp: Path, gateway: str, ports: list[int], train_s: float) -> list[Any]:
    port_dir = tmp / "ports"
    port_dir.mkdir()
    master = free_port()
    procs = []
    for rank in range(WORLD):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master),
            "WORLD_SIZE": str(WORLD),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "TRAINSENTRY_PROBE": "1",
            "TRAINSENTRY_PROBE_PORT": str(ports[rank]),
            "TRAINSENTRY_PROBE_BIND": "127.0.0.1",
            "TRAINSENTRY_PROBE_TOKEN": TOKEN,
            "TRAINSENTRY_GATEWAY_URL": gateway,
            "TRAINSENTRY_JOB": "llama",
            "TRAINSENTRY_NAMESPACE": "team-a",
            "TRAINSENTRY_NODE": f"gpu-{rank:02d}",
            "POD_NAME": f"llama-w-{rank}",
            "PORT_DIR": str(port_dir),
            "STALL_RANK": str(STALLED),
            "STALL_AFTER": str(train_s),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        log = (tmp / f"rank{rank}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "trainsentry.probe.launch", str(WORKER)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def one_run(train_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as folder:
        tmp = Path(folder)
        feishu = Feishu()
        ports = [free_port() for _ in range(WORLD)]
        gateway, url = start_gateway(tmp, feishu, ports)
        job = start_job(tmp, url, ports, train_s)
        try:
            mark = tmp / "ports" / f"stalled.{STALLED}"
            deadline = time.monotonic() + train_s + 600
            card_at = None
            while time.monotonic() < deadline and card_at is None:
                if any(p.poll() is not None for p in job):
                    raise RuntimeError("a rank exited: " + (tmp / "rank0.log").read_text()[-2000:])
                if mark.exists() and any(f"rank {STALLED} (pod" in c for c in feishu.cards()):
                    card_at = time.time()
                time.sleep(0.05)
            if card_at is None:
                raise RuntimeError(
                    "no card naming the rank: " + (tmp / "gateway.log").read_text()[-3000:]
                )
            stalled = float(mark.read_text())
            status = json.loads(
                urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/status", timeout=5).read()
            )
            threshold = max(
                (s["threshold_s"] for s in status.get("stalls", [])), default=float("nan")
            )
            return {
                "card_s": card_at - stalled,
                "threshold_s": threshold,
                "cards": float(len(feishu.cards())),
            }
        finally:
            for proc in job:
                proc.kill()
            gateway.terminate()
            gateway.wait(10)
            feishu.close()


def injected_run(train_s: float) -> dict[str, float]:
    """One run on the installed path, default probe settings (see the module docstring)."""
    from tests.support.install_scenario import cards, hang_paged, installed

    async def scenario() -> dict[str, float]:
        with tempfile.TemporaryDirectory(prefix="bench-hang-injected-") as folder:
            tmp = Path(folder)
            async with installed(tmp) as (cluster, feishu):
                run = await hang_paged(cluster, feishu, tmp, {"STALL_AFTER": str(train_s)})
                return {
                    "card_s": run.card_s,
                    "threshold_s": run.threshold_s,
                    "cards": float(len(cards(feishu))),
                }

    return asyncio.run(scenario())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--train", type=float, default=30.0)
    parser.add_argument(
        "--injected", action="store_true", help="the installed path: webhook, no launcher"
    )
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        result = injected_run(args.train) if args.injected else one_run(args.train)
        results.append(result)
        after = result["card_s"] - result["threshold_s"]
        print(
            f"run {run + 1}: stall -> card naming rank {STALLED}: {result['card_s']:.1f} s "
            f"(threshold {result['threshold_s']:.1f} s, after it {after:.1f} s; "
            f"cards sent {result['cards']:.0f})",
            flush=True,
        )
    cards = [r["card_s"] for r in results]
    extra = [r["card_s"] - r["threshold_s"] for r in results]
    print(
        f"median stall -> card {statistics.median(cards):.1f} s over {len(cards)} runs "
        f"(min {min(cards):.1f}, max {max(cards):.1f}); median after the threshold "
        f"{statistics.median(extra):.1f} s"
    )


if __name__ == "__main__":
    main()
