"""Stand-in exporters for issue 37's node death (tests/support/node_death.py drives them).

One aiohttp process serves, for an 8-node x 8-GPU TrainingJob, what the real exporters serve
(metric names and labels as they export them; the scrape config adds `node`, as the
PodMonitor/ServiceMonitor relabeling does):

  GET  /dcgm/{node}/metrics              dcgm-exporter (DCGM_FI_DEV_*, per `gpu`/`UUID`)
  GET  /node/{node}/metrics              node_exporter (memory, filesystem, EDAC, InfiniBand)
  GET  /ksm/metrics                      kube-state-metrics (nodes' Ready condition, the pods)
  GET  /probe/{node}/{local_rank}/metrics  the trainsentry probe of one rank (rank 0: RAS too)
  POST /start  {"t0": unix seconds}      the scenario's clock starts (before: all healthy)
  GET  /state                            {"death_at": when the node died, scenario seconds}
  GET  /-/ready

The scenario (a JSON file, --scenario; times in scenario seconds after t0, one real second
being `factor` of them: node_death.Timeline) decides every answer from the clock: the
XID, the node's death (its dcgm, node and probe endpoints accept the connection and never
answer, as a dead host's scrapes time out), Kubernetes' NotReady after
its grace period, NCCL RAS declaring the node's processes dead, the survivors waiting in
their collective, and in the second scenario the node's return and the GPU's.

Run from the repository root as `python -m tests.support.node_death_exporter --port N
--scenario FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.exposition import Page

GPUS_PER_NODE = 8
IB_PORTS = (("mlx5_0", "1"), ("mlx5_1", "1"), ("mlx5_2", "1"), ("mlx5_3", "1"))
SEQ_PER_SECOND = 2  # collectives a healthy job completes per scenario second
# The node dies `death_at` after the XID, but not before Prometheus scraped the XID this many
# times: with 15 s scrapes and 30 s evaluations a GPU that fell off 20 s before its node
# died can be scraped once and go stale before any evaluation saw it (a real race; the
# issue's run saw the alert, and this scenario is about what follows it).
XID_SCRAPES_BEFORE_DEATH = 3
NEVER = float("inf")


@dataclass(frozen=True)
class Scenario:
    """When things happen, in scenario seconds after t0 (None: never)."""

    factor: float
    namespace: str
    job: str
    nodes: list[str]
    dead_node: str
    dead_gpu: int
    xid_at: float | None  # None: nothing happens to this job (fabric_death: another team)
    death_at: float
    not_ready_after: float  # Kubernetes' node-monitor grace period
    ras_dead_after: float  # NCCL RAS gives up on the node's processes
    back_at: float | None
    gpu_back_at: float | None
    restart_at: float | None = None

    @classmethod
    def load(cls, data: dict[str, Any]) -> Scenario:
        return cls(**data)

    def pod(self, node: str) -> str:
        return f"{self.job}-worker-{self.nodes.index(node)}"

    def rank(self, node: str, local_rank: int) -> int:
        return self.nodes.index(node) * GPUS_PER_NODE + local_rank


class Clock:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.t0: float | None = None

    def now(self) -> float:
        """Scenario seconds since t0; far before 0 until /start."""
        if self.t0 is None:
            return -1e6
        return (time.time() - self.t0) * self.scenario.factor

    def between(self, start: float | None, end: float | None) -> bool:
        now = self.now()
        return (start if start is not None else NEVER) <= now < (end if end is not None else NEVER)


class World:
    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.clock = Clock(scenario)
        self.started = time.time()
        self.xid_served: list[float] = []  # scenario times the XID was scraped

    @property
    def death_at(self) -> float:
        """When the node died: `death_at`, or later, once the XID was scraped enough."""
        if len(self.xid_served) < XID_SCRAPES_BEFORE_DEATH:
            return NEVER
        return max(self.s.death_at, self.xid_served[XID_SCRAPES_BEFORE_DEATH - 1])

    # --- state -------------------------------------------------------------------------

    def dead(self, node: str) -> bool:
        return node == self.s.dead_node and self.clock.between(self.death_at, self.s.back_at)

    def not_ready(self, node: str) -> bool:
        start = self.death_at + self.s.not_ready_after
        return node == self.s.dead_node and self.clock.between(start, self.s.back_at)

    def gpu_state(self, node: str, gpu: int) -> str:
        """healthy | xid (reports XID 79) | missing (not exported at all)."""
        if node != self.s.dead_node or gpu != self.s.dead_gpu:
            return "healthy"
        if self.clock.between(self.s.gpu_back_at, None):
            return "healthy"
        if self.s.back_at is not None and self.clock.between(self.s.back_at, None):
            return "missing"  # back from the dead without the GPU
        return "xid" if self.clock.between(self.s.xid_at, None) else "healthy"

    def hung(self) -> bool:
        return self.clock.between(self.s.xid_at, self.s.restart_at)

    def ras_dead(self) -> bool:
        return self.clock.between(self.death_at + self.s.ras_dead_after, self.s.restart_at)

    # --- pages -------------------------------------------------------------------------

    def dcgm(self, node: str) -> str:
        page = Page()
        node_index = self.s.nodes.index(node)
        for gpu in range(GPUS_PER_NODE):
            state = self.gpu_state(node, gpu)
            if state == "missing":
                continue
            labels = {
                "gpu": str(gpu),
                "UUID": f"GPU-{node_index:02d}{gpu:02d}aaaa-bbbb-cccc-dddd",
                "device": f"nvidia{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": node,
            }
            page.add("DCGM_FI_DEV_GPU_TEMP", "gauge", 55 + gpu, **labels)
            page.add("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 65 + gpu, **labels)
            page.add("DCGM_FI_DEV_GPU_UTIL", "gauge", 0 if self.hung() else 97, **labels)
            page.add("DCGM_FI_DEV_POWER_USAGE", "gauge", 650.5, **labels)
            page.add("DCGM_FI_DEV_SM_CLOCK", "gauge", 1980, **labels)
            page.add("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", 0, **labels)
            page.add("DCGM_FI_DEV_XID_ERRORS", "gauge", 79 if state == "xid" else 0, **labels)
            if state == "xid" and len(self.xid_served) < XID_SCRAPES_BEFORE_DEATH:
                self.xid_served.append(self.clock.now())
            for name in (
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "DCGM_FI_DEV_RETIRED_SBE",
                "DCGM_FI_DEV_RETIRED_DBE",
                "DCGM_FI_DEV_RETIRED_PENDING",
                "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                "DCGM_FI_DEV_ROW_REMAP_PENDING",
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            ):
                page.add(name, "gauge", 0, **labels)
            for name in (
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
            ):
                page.add(name, "counter", 0, **labels)
        return page.text()

    def node_exporter(self, node: str) -> str:
        page = Page()
        page.add("node_boot_time_seconds", "gauge", self.started - 30 * 86400)
        page.add("node_memory_MemAvailable_bytes", "gauge", 1.2e12)
        page.add("node_memory_MemTotal_bytes", "gauge", 2.0e12)
        page.add("node_vmstat_oom_kill", "untyped", 0)
        for mount, device in (("/", "/dev/nvme0n1p1"), ("/data", "/dev/md0")):
            fs = {"mountpoint": mount, "device": device, "fstype": "xfs"}
            page.add("node_filesystem_avail_bytes", "gauge", 4e12, **fs)
            page.add("node_filesystem_size_bytes", "gauge", 7e12, **fs)
            page.add("node_filesystem_files_free", "gauge", 9e8, **fs)
            page.add("node_filesystem_files", "gauge", 1e9, **fs)
        page.add("node_timex_offset_seconds", "gauge", 0.0002)
        page.add("node_timex_sync_status", "gauge", 1)
        page.add("node_edac_uncorrectable_errors_total", "counter", 0, controller="0")
        page.add("node_network_receive_errs_total", "counter", 0, device="eth0")
        page.add("node_network_transmit_errs_total", "counter", 0, device="eth0")
        page.add("node_network_carrier_changes_total", "counter", 1, device="eth0")
        for device, port in IB_PORTS:
            ib = {"device": device, "port": port}
            page.add("node_infiniband_state_id", "gauge", 4, **ib)
            page.add("node_infiniband_physical_state_id", "gauge", 5, **ib)
            page.add("node_infiniband_rate_bytes_per_second", "gauge", 5e10, **ib)
            for name in (
                "node_infiniband_link_downed_total",
                "node_infiniband_link_error_recovery_total",
                "node_infiniband_symbol_error_total",
                "node_infiniband_port_errors_received_total",
                "node_infiniband_port_receive_remote_physical_errors_total",
                "node_infiniband_port_discards_transmitted_total",
                "node_infiniband_port_transmit_wait_total",
            ):
                page.add(name, "counter", 0, **ib)
        return page.text()

    def kube_state_metrics(self) -> str:
        page = Page()
        for node in self.s.nodes:
            down = self.not_ready(node)
            for status, value in (
                ("true", 0 if down else 1),
                ("false", 0),
                ("unknown", 1 if down else 0),
            ):
                page.add(
                    "kube_node_status_condition",
                    "gauge",
                    value,
                    node=node,
                    condition="Ready",
                    status=status,
                )
            for condition in ("MemoryPressure", "DiskPressure", "PIDPressure"):
                for status, value in (
                    ("true", 0),
                    ("false", 0 if down else 1),
                    ("unknown", 1 if down else 0),
                ):
                    page.add(
                        "kube_node_status_condition",
                        "gauge",
                        value,
                        node=node,
                        condition=condition,
                        status=status,
                    )
            page.add("kube_node_spec_unschedulable", "gauge", 0, node=node)
        for index, node in enumerate(self.s.nodes):
            pod = self.s.pod(node)
            ids = {"namespace": self.s.namespace, "pod": pod}
            page.add(
                "kube_pod_info",
                "gauge",
                1,
                **ids,
                node=node,
                host_ip=f"10.0.{index}.1",
                pod_ip=f"10.1.{index}.7",
                uid=f"uid-{pod}",
                created_by_kind="PyTorchJob",
                created_by_name=self.s.job,
            )
            # A dead node's pods stay Running in the API until the node is back or they are
            # evicted (after the 5 min NoExecute toleration, not in these 8 minutes).
            for phase in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
                page.add(
                    "kube_pod_status_phase",
                    "gauge",
                    1 if phase == "Running" else 0,
                    **ids,
                    phase=phase,
                )
            page.add("kube_pod_status_reason", "gauge", 0, **ids, reason="Evicted")
            container = {**ids, "container": "pytorch"}
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
        return page.text()

    def probe(self, node: str, local_rank: int) -> str:
        page = Page()
        rank = self.s.rank(node, local_rank)
        base = {
            "namespace": self.s.namespace,
            "trainingjob": self.s.job,
            "node": node,
            "rank": str(rank),
            "local_rank": str(local_rank),
        }
        pg = {**base, "pg": "0", "pg_desc": "default_pg"}
        now = self.clock.now()
        page.add(
            "trainsentry_probe_info",
            "gauge",
            1,
            **base,
            world_size=str(len(self.s.nodes) * GPUS_PER_NODE),
        )
        page.add("trainsentry_probe_healthy", "gauge", 1, **base)
        page.add("trainsentry_probe_blind", "gauge", 0, **base)
        page.add("trainsentry_probe_process_groups", "gauge", 1, **base)
        if self.hung():
            frozen = int(SEQ_PER_SECOND * (self.s.xid_at + 1e6))
            waited = now - self.s.xid_at
            culprit = node == self.s.dead_node and local_rank == self.s.dead_gpu
            enqueued = frozen if culprit else frozen + 1
            page.add("trainsentry_probe_last_enqueued_seq", "gauge", enqueued, **pg)
            page.add("trainsentry_probe_last_started_seq", "gauge", enqueued, **pg)
            page.add("trainsentry_probe_last_completed_seq", "gauge", frozen, **pg)
            page.add(
                "trainsentry_probe_seconds_since_last_completion", "gauge", round(waited, 3), **pg
            )
            page.add("trainsentry_probe_inflight_seq", "gauge", -1 if culprit else frozen + 1, **pg)
            page.add(
                "trainsentry_probe_inflight_seconds",
                "gauge",
                0 if culprit else round(waited, 3),
                **pg,
            )
        else:
            seq = int(SEQ_PER_SECOND * (max(now, -1e6 + 1) + 1e6))
            page.add("trainsentry_probe_last_enqueued_seq", "gauge", seq + 1, **pg)
            page.add("trainsentry_probe_last_started_seq", "gauge", seq + 1, **pg)
            page.add("trainsentry_probe_last_completed_seq", "gauge", seq, **pg)
            page.add("trainsentry_probe_seconds_since_last_completion", "gauge", 0.2, **pg)
            page.add("trainsentry_probe_inflight_seq", "gauge", seq + 1, **pg)
            page.add("trainsentry_probe_inflight_seconds", "gauge", 0.1, **pg)
        page.add("trainsentry_probe_collective_wait_seconds_total", "counter", 0, **pg)
        if rank == 0:
            dead = self.ras_dead()
            lost = GPUS_PER_NODE if dead else 0
            page.add("trainsentry_probe_ras_up", "gauge", 1, **base)
            page.add("trainsentry_probe_ras_communicators", "gauge", 1, **base)
            page.add("trainsentry_probe_ras_missing_ranks", "gauge", lost, **base)
            page.add("trainsentry_probe_ras_unresponsive_processes", "gauge", lost, **base)
            page.add("trainsentry_probe_ras_dead_processes", "gauge", lost, **base)
            page.add(
                "trainsentry_probe_ras_incomplete_communicators", "gauge", 1 if dead else 0, **base
            )
            for name in ("mismatch_communicators", "error_communicators", "timeouts"):
                page.add(f"trainsentry_probe_ras_{name}", "gauge", 0, **base)
            if dead:
                first = self.s.rank(self.s.dead_node, 0)
                for comm_rank in range(first, first + GPUS_PER_NODE):
                    page.add(
                        "trainsentry_probe_ras_suspect",
                        "gauge",
                        1,
                        **base,
                        communicator="0x5a1e7c0de",
                        comm_rank=str(comm_rank),
                        state="dead",
                        host=self.s.dead_node,
                        pid=str(4000 + comm_rank),
                    )
        return page.text()


def make_app(world: World) -> web.Application:
    app = web.Application()

    def text(body: str) -> web.Response:
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def dead_host() -> web.Response:
        # The connection is taken (a load balancer or a half-dead kernel); no answer comes:
        # Prometheus' scrape times out, as against a dead node.
        await asyncio.sleep(3600)
        raise web.HTTPGatewayTimeout()

    def known(node: str) -> str:
        if node not in world.s.nodes:
            raise web.HTTPNotFound()
        return node

    async def dcgm(request: web.Request) -> web.Response:
        node = known(request.match_info["node"])
        return await dead_host() if world.dead(node) else text(world.dcgm(node))

    async def node_exporter(request: web.Request) -> web.Response:
        node = known(request.match_info["node"])
        return await dead_host() if world.dead(node) else text(world.node_exporter(node))

    async def ksm(_request: web.Request) -> web.Response:
        return text(world.kube_state_metrics())

    async def probe(request: web.Request) -> web.Response:
        node = known(request.match_info["node"])
        local_rank = int(request.match_info["local_rank"])
        # The training processes died with the node: its probes stay silent after it comes
        # back, until the job's pods are restarted (`restart_at`).
        if node == world.s.dead_node and world.clock.between(world.death_at, world.s.restart_at):
            return await dead_host()
        return text(world.probe(node, local_rank))

    async def start(request: web.Request) -> web.Response:
        world.clock.t0 = float((await request.json())["t0"])
        return web.json_response({"ok": True})

    async def ready(_request: web.Request) -> web.Response:
        return text("ok")

    async def state(_request: web.Request) -> web.Response:
        death = world.death_at
        return web.json_response({"death_at": None if death == NEVER else death})

    app.router.add_get("/dcgm/{node}/metrics", dcgm)
    app.router.add_get("/node/{node}/metrics", node_exporter)
    app.router.add_get("/ksm/metrics", ksm)
    app.router.add_get("/probe/{node}/{local_rank}/metrics", probe)
    app.router.add_post("/start", start)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/state", state)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--scenario", required=True)
    args = parser.parse_args()
    with open(args.scenario, encoding="utf-8") as handle:
        scenario = Scenario.load(json.load(handle))
    web.run_app(make_app(World(scenario)), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
