"""A test exporter serving dcgm-exporter-, node_exporter-, kube-state-metrics- and
probe-format series for a small fixed cluster, with faults injectable over HTTP.

Run from the repository root: python -m tests.rules.fixture_exporter --port N
  GET  /dcgm/{node}/metrics   dcgm-exporter series of one node (no `node` label: the
                              scrape config adds it, as the PodMonitor relabeling does)
  GET  /node/{node}/metrics   node_exporter series of one node (incl. infiniband)
  GET  /ksm/metrics           kube-state-metrics series of the cluster
  GET  /probe/metrics         trainsentry probe series of the job's ranks
  POST /faults                {"xid": [{"node", "gpu", "code"}],
                               "gpu_temp": [{"node", "gpu", "celsius"}],
                               "ib_down": [{"node", "device", "port"}]}
  GET  /-/ready
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.exposition import Page

NODES = ("gpu-node-1", "gpu-node-2")
GPUS_PER_NODE = 4
IB_PORTS = (("mlx5_0", "1"), ("mlx5_1", "1"))
NAMESPACE = "team-a"
JOB = "llm"
PODS = {f"{JOB}-worker-{i}": node for i, node in enumerate(NODES)}
START = time.time()


@dataclass
class Faults:
    xid: dict[tuple[str, str], int] = field(default_factory=dict)
    gpu_temp: dict[tuple[str, str], float] = field(default_factory=dict)
    ib_down: set[tuple[str, str, str]] = field(default_factory=set)

    def apply(self, body: dict[str, Any]) -> None:
        for item in body.get("xid", []):
            self.xid[(item["node"], str(item["gpu"]))] = int(item["code"])
        for item in body.get("gpu_temp", []):
            self.gpu_temp[(item["node"], str(item["gpu"]))] = float(item["celsius"])
        for item in body.get("ib_down", []):
            self.ib_down.add((item["node"], item["device"], str(item["port"])))


def dcgm_page(node: str, faults: Faults) -> str:
    page = Page()
    elapsed = time.time() - START
    node_index = NODES.index(node)
    for gpu in range(GPUS_PER_NODE):
        key = (node, str(gpu))
        labels = {
            "gpu": str(gpu),
            "UUID": f"GPU-{node_index}{gpu:03d}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": node,
        }
        page.add("DCGM_FI_DEV_GPU_TEMP", "gauge", faults.gpu_temp.get(key, 60 + gpu), **labels)
        page.add("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 70 + gpu, **labels)
        page.add("DCGM_FI_DEV_GPU_UTIL", "gauge", 95, **labels)
        page.add("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", 40, **labels)
        page.add("DCGM_FI_DEV_FB_USED", "gauge", 70000, **labels)
        page.add("DCGM_FI_DEV_FB_FREE", "gauge", 11000, **labels)
        page.add("DCGM_FI_DEV_SM_CLOCK", "gauge", 1980, **labels)
        page.add("DCGM_FI_DEV_MEM_CLOCK", "gauge", 2619, **labels)
        page.add("DCGM_FI_DEV_POWER_USAGE", "gauge", 650.5, **labels)
        page.add("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", 0, **labels)
        page.add("DCGM_FI_DEV_XID_ERRORS", "gauge", faults.xid.get(key, 0), **labels)
        for name in (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_RETIRED_SBE",
            "DCGM_FI_DEV_RETIRED_DBE",
            "DCGM_FI_DEV_RETIRED_PENDING",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        ):
            page.add(name, "gauge", 0, **labels)
        page.add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", 3, **labels)
        page.add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", 1, **labels)
        page.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", 2, **labels)
        page.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", 1, **labels)
        page.add("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", 0, **labels)
        page.add("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", 1, **labels)
        page.add("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", 1e9 * elapsed, **labels)
    return page.text()


def node_page(node: str, faults: Faults) -> str:
    page = Page()
    elapsed = time.time() - START
    page.add("node_boot_time_seconds", "gauge", START - 86400)
    page.add("node_memory_MemAvailable_bytes", "gauge", 1.2e12)
    page.add("node_memory_MemTotal_bytes", "gauge", 2.0e12)
    page.add("node_vmstat_oom_kill", "untyped", 0)
    for mount, device in (("/", "/dev/sda1"), ("/data", "/dev/md0")):
        fs = {"mountpoint": mount, "device": device, "fstype": "xfs"}
        page.add("node_filesystem_avail_bytes", "gauge", 4e12, **fs)
        page.add("node_filesystem_size_bytes", "gauge", 7e12, **fs)
        page.add("node_filesystem_files_free", "gauge", 9e8, **fs)
        page.add("node_filesystem_files", "gauge", 1e9, **fs)
    page.add("node_timex_offset_seconds", "gauge", 0.0002)
    page.add("node_timex_sync_status", "gauge", 1)
    for dev in ("eth0", "lo"):
        page.add("node_network_receive_errs_total", "counter", 0, device=dev)
        page.add("node_network_transmit_errs_total", "counter", 0, device=dev)
        page.add("node_network_carrier_changes_total", "counter", 2, device=dev)
    page.add("node_edac_uncorrectable_errors_total", "counter", 0, controller="0")
    for device, port in IB_PORTS:
        down = (node, device, port) in faults.ib_down
        ib = {"device": device, "port": port}
        page.add("node_infiniband_state_id", "gauge", 1 if down else 4, **ib)
        page.add("node_infiniband_physical_state_id", "gauge", 3 if down else 5, **ib)
        page.add("node_infiniband_rate_bytes_per_second", "gauge", 5e10, **ib)
        for name in (
            "node_infiniband_link_downed_total",
            "node_infiniband_link_error_recovery_total",
            "node_infiniband_symbol_error_total",
            "node_infiniband_port_errors_received_total",
            "node_infiniband_port_receive_remote_physical_errors_total",
            "node_infiniband_port_discards_transmitted_total",
        ):
            page.add(name, "counter", 0, **ib)
        page.add("node_infiniband_port_transmit_wait_total", "counter", 1000 * elapsed, **ib)
        for name in (
            "node_infiniband_port_data_transmitted_bytes_total",
            "node_infiniband_port_data_received_bytes_total",
        ):
            page.add(name, "counter", 2e10 * elapsed, **ib)
    return page.text()


def ksm_page() -> str:
    page = Page()
    for node in NODES:
        for condition, value in (
            ("Ready", 1),
            ("MemoryPressure", 0),
            ("DiskPressure", 0),
            ("PIDPressure", 0),
        ):
            page.add(
                "kube_node_status_condition",
                "gauge",
                value,
                node=node,
                **{"condition": condition, "status": "true"},
            )
        page.add("kube_node_spec_unschedulable", "gauge", 0, node=node)
    for pod, node in PODS.items():
        ids = {"namespace": NAMESPACE, "pod": pod}
        page.add("kube_pod_info", "gauge", 1, **ids, node=node, host_ip="10.0.0.1", uid=pod)
        page.add("kube_pod_status_phase", "gauge", 1, **ids, phase="Running")
        page.add("kube_pod_status_phase", "gauge", 0, **ids, phase="Pending")
        page.add("kube_pod_status_reason", "gauge", 0, **ids, reason="Evicted")
        container = {**ids, "container": "trainer"}
        page.add("kube_pod_container_status_restarts_total", "counter", 0, **container)
        page.add(
            "kube_pod_container_status_waiting_reason",
            "gauge",
            0,
            **container,
            reason="CrashLoopBackOff",
        )
        page.add(
            "kube_pod_container_status_last_terminated_reason",
            "gauge",
            0,
            **container,
            reason="OOMKilled",
        )
    # an unrelated pod in another namespace
    page.add("kube_pod_info", "gauge", 1, namespace="other", pod="web-0", node=NODES[0], uid="w")
    return page.text()


def probe_page() -> str:
    page = Page()
    elapsed = time.time() - START
    for rank, node in enumerate(NODES):
        base = {
            "namespace": NAMESPACE,
            "trainingjob": JOB,
            "node": node,
            "rank": str(rank),
            "local_rank": "0",
        }
        pg = {**base, "pg": "0", "pg_desc": "default_pg"}
        page.add("trainsentry_probe_step", "gauge", int(elapsed), **base)
        page.add("trainsentry_probe_last_completed_seq", "gauge", int(10 * elapsed), **pg)
        page.add("trainsentry_probe_seconds_since_last_completion", "gauge", 0.1, **pg)
        page.add("trainsentry_probe_inflight_seconds", "gauge", 0.05, **pg)
    return page.text()


def make_app() -> web.Application:
    faults = Faults()
    app = web.Application()

    def text(body: str) -> web.Response:
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def dcgm(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if node not in NODES:
            raise web.HTTPNotFound()
        return text(dcgm_page(node, faults))

    async def node_metrics(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if node not in NODES:
            raise web.HTTPNotFound()
        return text(node_page(node, faults))

    async def ksm(_request: web.Request) -> web.Response:
        return text(ksm_page())

    async def probe(_request: web.Request) -> web.Response:
        return text(probe_page())

    async def set_faults(request: web.Request) -> web.Response:
        faults.apply(await request.json())
        return web.json_response({"ok": True})

    async def ready(_request: web.Request) -> web.Response:
        return text("ok")

    app.router.add_get("/dcgm/{node}/metrics", dcgm)
    app.router.add_get("/node/{node}/metrics", node_metrics)
    app.router.add_get("/ksm/metrics", ksm)
    app.router.add_get("/probe/metrics", probe)
    app.router.add_post("/faults", set_faults)
    app.router.add_get("/-/ready", ready)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(make_app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
