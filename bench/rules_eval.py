"""Benchmark: what the shipped alert rules cost a real Prometheus, cluster-wide vs per job.

A synthetic cluster (NODES nodes x 8 GPUs x 8 IB ports, dcgm-exporter + node_exporter +
kube-state-metrics series) is served on loopback and scraped by a real Prometheus that
loads, side by side:
  - baseline: rules/{gpu,fabric,node,kubernetes}.yaml as shipped (cluster-wide), and
  - job-scoped: the same files rendered for one TrainingJob on JOB_NODES nodes, exactly as
    docs/alerts.md section 1 specifies (membership join), with the membership rules.
Prometheus measures each rule group's evaluation time itself (`/api/v1/rules`); the
script samples it every evaluation and prints medians per file and the ratio
job-scoped / cluster-wide. Not run by the test suite.

    .venv/bin/python -m bench.rules_eval [--nodes 16] [--job-nodes 4] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]

from tests.rules.jobscope import membership_group, render_for_job  # noqa: E402
from tests.support.realservers import free_port, start_prometheus  # noqa: E402

RULE_FILES = ("gpu.yaml", "fabric.yaml", "node.yaml", "kubernetes.yaml")
DCGM_GAUGES = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
)
DCGM_COUNTERS = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
IB_GAUGES = (
    "node_infiniband_state_id",
    "node_infiniband_physical_state_id",
    "node_infiniband_rate_bytes_per_second",
)
IB_COUNTERS = (
    "node_infiniband_link_downed_total",
    "node_infiniband_link_error_recovery_total",
    "node_infiniband_symbol_error_total",
    "node_infiniband_port_errors_received_total",
    "node_infiniband_port_receive_remote_physical_errors_total",
    "node_infiniband_port_discards_transmitted_total",
    "node_infiniband_port_transmit_wait_total",
)


def node_name(i: int) -> str:
    return f"gpu-node-{i:03d}"


def dcgm_text(start: float) -> str:
    tick = int(time.time() - start)
    lines = []
    for gpu in range(8):
        labels = f'gpu="{gpu}",UUID="GPU-{gpu}"'
        for name in DCGM_GAUGES:
            value = 60 if name.endswith("TEMP") else 0
            lines.append(f"{name}{{{labels}}} {value}")
        lines += [f"{name}{{{labels}}} {tick}" for name in DCGM_COUNTERS]
    return "\n".join(lines) + "\n"


def node_text(start: float) -> str:
    tick = int(time.time() - start)
    lines = [
        f"node_boot_time_seconds {start - 86400}",
        "node_memory_MemAvailable_bytes 1e12",
        "node_memory_MemTotal_bytes 2e12",
        "node_vmstat_oom_kill 0",
        "node_timex_offset_seconds 0.0001",
        "node_timex_sync_status 1",
        'node_edac_uncorrectable_errors_total{controller="0"} 0',
    ]
    for mount in ("/", "/data", "/checkpoint"):
        fs = f'mountpoint="{mount}",device="/dev/x",fstype="xfs"'
        sizes = (("avail_bytes", 5e12), ("size_bytes", 7e12), ("files_free", 9e8), ("files", 1e9))
        lines += [f"node_filesystem_{m}{{{fs}}} {v}" for m, v in sizes]
    for dev in ("eth0", "eth1"):
        lines += [
            f'node_network_{m}{{device="{dev}"}} {tick}'
            for m in ("receive_errs_total", "transmit_errs_total", "carrier_changes_total")
        ]
    for port in range(8):
        ib = f'device="mlx5_{port}",port="1"'
        lines += [f"{name}{{{ib}}} {v}" for name, v in zip(IB_GAUGES, (4, 5, 5e10), strict=True)]
        lines += [f"{name}{{{ib}}} {tick}" for name in IB_COUNTERS]
    return "\n".join(lines) + "\n"


def ksm_text(nodes: int, job_nodes: int) -> str:
    lines = []
    for i in range(nodes):
        node = node_name(i)
        ready = f'node="{node}",condition="Ready",status="true"'
        lines.append(f"kube_node_status_condition{{{ready}}} 1")
        lines.append(f'kube_node_spec_unschedulable{{node="{node}"}} 0')
        job = "llm" if i < job_nodes else f"other{i}"
        pod = f'namespace="team-a",pod="{job}-worker-{i}"'
        lines.append(f'kube_pod_info{{{pod},node="{node}"}} 1')
        lines.append(f'kube_pod_status_phase{{{pod},phase="Pending"}} 0')
        lines.append(f'kube_pod_container_status_restarts_total{{{pod},container="trainer"}} 0')
    return "\n".join(lines) + "\n"


def serve(port: int, nodes: int, job_nodes: int, ready: threading.Event) -> None:
    start = time.time()
    app = web.Application()

    async def dcgm(_r: web.Request) -> web.Response:
        return web.Response(text=dcgm_text(start))

    async def node(_r: web.Request) -> web.Response:
        return web.Response(text=node_text(start))

    async def ksm(_r: web.Request) -> web.Response:
        return web.Response(text=ksm_text(nodes, job_nodes))

    app.router.add_get("/dcgm/{node}", dcgm)
    app.router.add_get("/node/{node}", node)
    app.router.add_get("/ksm", ksm)

    async def run() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(run())


def prometheus_config(address: str, nodes: int, interval: str) -> dict[str, Any]:
    def targets(kind: str) -> list[dict[str, Any]]:
        return [
            {
                "targets": [address],
                "labels": {"node": node_name(i), "__metrics_path__": f"/{kind}/{node_name(i)}"},
            }
            for i in range(nodes)
        ]

    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": "dcgm-exporter", "static_configs": targets("dcgm")},
            {"job_name": "node-exporter", "static_configs": targets("node")},
            {
                "job_name": "kube-state-metrics",
                "metrics_path": "/ksm",
                "honor_labels": True,
                "static_configs": [{"targets": [address]}],
            },
        ],
    }


def rule_files(directory: Path) -> list[Path]:
    paths = []
    for name in RULE_FILES:
        document = yaml.safe_load((ROOT / "rules" / name).read_text())
        # a job that tunes every rule (here: its priority, unchanged) has a copy of each;
        # an untuned job has none of the node rules (docs/alerts.md "Job scope")
        priorities = {
            rule["alert"]: rule["labels"]["priority"]
            for group in document["groups"]
            for rule in group["rules"]
            if "alert" in rule
        }
        for variant, doc in (
            ("cluster", document),
            ("job", render_for_job(document, "team-a", "llm", priorities=priorities)),
        ):
            for group in doc["groups"]:
                group["name"] = f"{variant}:{name}:{group['name']}"
            path = directory / f"{variant}-{name}"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            paths.append(path)
    membership = directory / "membership.yaml"
    group = membership_group("team-a", "llm", "llm-worker-.*")
    group["name"] = "membership"
    membership.write_text(yaml.safe_dump({"groups": [group]}))
    return [membership, *paths]


def time_alert_queries(url: str, directory: Path, repeat: int = 3) -> list[tuple[float, str]]:
    """Median wall time of each alert expr as an instant query (both variants)."""
    timings = []
    for path in sorted(directory.glob("*-*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                query = urllib.parse.urlencode({"query": rule["expr"]})
                runs = []
                for _ in range(repeat):
                    begin = time.perf_counter()
                    urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=120).read()
                    runs.append(time.perf_counter() - begin)
                timings.append((statistics.median(runs) * 1000, f"{path.stem}:{rule['alert']}"))
    return sorted(timings, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--job-nodes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--interval", default="5s")
    args = parser.parse_args()

    port = free_port()
    ready = threading.Event()
    threading.Thread(
        target=serve, args=(port, args.nodes, args.job_nodes, ready), daemon=True
    ).start()
    ready.wait(10)
    samples: dict[str, list[float]] = defaultdict(list)
    seen: dict[str, str] = {}
    with TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config = prometheus_config(f"127.0.0.1:{port}", args.nodes, args.interval)
        with start_prometheus(directory, config, rule_files(directory)) as prom:
            deadline = time.monotonic() + args.seconds
            time.sleep(min(10.0, args.seconds / 4))  # let the TSDB fill a little
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"{prom.url}/api/v1/rules", timeout=10) as response:
                    groups = yaml.safe_load(response.read())["data"]["groups"]
                for group in groups:
                    key = group["name"]
                    if group.get("lastEvaluation") != seen.get(key):
                        seen[key] = group.get("lastEvaluation")
                        samples[key].append(group["evaluationTime"])
                time.sleep(0.5)
            slowest = time_alert_queries(prom.url, directory)
            series = yaml.safe_load(
                urllib.request.urlopen(
                    f"{prom.url}/api/v1/query?query=count(%7B__name__%3D~%22.%2B%22%7D)", timeout=10
                ).read()
            )["data"]["result"][0]["value"][1]

    print(
        f"cluster: {args.nodes} nodes x 8 GPUs x 8 IB ports, {series} series; "
        f"job on {args.job_nodes} nodes; eval interval {args.interval}"
    )
    print(f"{'rule file':<18}{'cluster-wide ms':>17}{'job-scoped ms':>15}{'ratio':>8}{'n':>5}")
    totals = {"cluster": 0.0, "job": 0.0}
    for name in RULE_FILES:
        per_variant = {}
        n = 0
        for variant in ("cluster", "job"):
            # a file may hold several groups: sum the medians of its groups
            groups = [v for k, v in samples.items() if k.startswith(f"{variant}:{name}:")]
            per_variant[variant] = sum(statistics.median(v) for v in groups) * 1000
            totals[variant] += per_variant[variant]
            n = min(len(v) for v in groups)
        ratio = per_variant["job"] / per_variant["cluster"]
        print(
            f"{name:<18}{per_variant['cluster']:>17.2f}{per_variant['job']:>15.2f}"
            f"{ratio:>8.2f}{n:>5}"
        )
    print("slowest alert queries (median of 3 instant queries, ms):")
    for ms, name in slowest[:8]:
        print(f"  {ms:8.2f}  {name}")
    print(
        f"{'total':<18}{totals['cluster']:>17.2f}{totals['job']:>15.2f}"
        f"{totals['job'] / totals['cluster']:>8.2f}"
    )


if __name__ == "__main__":
    main()
