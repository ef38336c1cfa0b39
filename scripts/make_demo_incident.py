#!/usr/bin/env python3
"""Writes trainsentry/data/demo_incident.json.gz: the incident `trainsentry demo` replays.

A 64-node job (llama-70b, 8 GPUs per node) has a bad night: a GPU falls off the bus (XID 79),
an InfiniBand port flaps, a full checkpoint disk sends 200 node alerts at once, then things
are fixed and resolve. Times are seconds from the start; alert starts are offsets too.
Alertmanager's repeats (the same group sent again) are part of the recording.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

JOB = {"trainingjob": "llama-70b", "namespace": "ml"}
RUNBOOK = "https://runbooks.example.com/trainsentry/"


def alert(
    name: str,
    priority: str,
    component: str,
    start: float,
    summary: str,
    description: str,
    **labels: str,
) -> dict[str, Any]:
    return {
        "labels": {
            "alertname": name,
            "priority": priority,
            "component": component,
            **JOB,
            **labels,
        },
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": RUNBOOK + name.lower(),
        },
        "start": start,
    }


def main() -> None:
    steps: list[dict[str, Any]] = []
    xid = alert(
        "GPUFellOffBus",
        "P0",
        "gpu",
        60,
        "GPU 3 on gpu-node-17 fell off the bus (XID 79)",
        "DCGM reports XID 79 on GPU 3 (UUID GPU-5e1a...); every rank on it is dead. "
        "Drain the node and reseat/replace the GPU.",
        node="gpu-node-17",
        gpu="3",
        Hostname="gpu-node-17",
        xid="79",
        pod="llama-70b-worker-17",
        rank="139",
    )
    steps.append({"at": 62, "note": "GPU 3 on gpu-node-17 falls off the bus", "firing": [xid]})
    steps.append({"at": 92, "note": "Alertmanager repeats the group", "firing": [xid]})
    port = {"node": "gpu-node-42", "device": "mlx5_2", "port": "1", "Hostname": "gpu-node-42"}
    for flap in range(5):
        start = 180 + flap * 40
        link = alert(
            "IBPhysicalLinkDown",
            "P0",
            "fabric",
            start,
            "InfiniBand mlx5_2 port 1 on gpu-node-42 is physically down",
            "Physical state is not LinkUp; collectives crossing this port stall.",
            **port,
        )
        steps.append({"at": start + 2, "note": f"IB link down ({flap + 1}/5)", "firing": [link]})
        steps.append(
            {
                "at": start + 22,
                "note": f"IB link up again ({flap + 1}/5)",
                "resolved": [{**link, "end": start + 20}],
            }
        )
    burst = []
    for node in range(64):
        for mount in ("/checkpoints", "/data", "/scratch"):
            if len(burst) == 192:
                break
            burst.append(
                alert(
                    "NodeFilesystemSpaceLow",
                    "P2",
                    "node",
                    420,
                    f"{mount} on gpu-node-{node:02d} is 93% full",
                    f"Free space on {mount} fell below 10% (7% left).",
                    node=f"gpu-node-{node:02d}",
                    mountpoint=mount,
                    Hostname=f"gpu-node-{node:02d}",
                )
            )
    for node in range(8):
        burst.append(
            alert(
                "NodeOOMKills",
                "P1",
                "node",
                425,
                f"OOM killer ran on gpu-node-{node:02d}",
                "2 processes were OOM-killed in the last 5 minutes.",
                node=f"gpu-node-{node:02d}",
                Hostname=f"gpu-node-{node:02d}",
            )
        )
    for chunk in range(0, len(burst), 50):
        steps.append(
            {
                "at": 430 + chunk // 50,
                "note": "checkpoint disks fill up (200 alerts)",
                "firing": burst[chunk : chunk + 50],
            }
        )
    steps.append(
        {"at": 900, "note": "XID 79 GPU replaced, node back", "resolved": [{**xid, "end": 895}]}
    )
    for chunk in range(0, len(burst), 50):
        steps.append(
            {
                "at": 1200 + chunk // 50,
                "note": "old checkpoints deleted: disks recover",
                "resolved": [{**a, "end": 1195} for a in burst[chunk : chunk + 50]],
            }
        )
    incident = {
        "title": "llama-70b on 64 nodes: XID 79, a flapping IB port, full checkpoint disks",
        "job": JOB,
        "nodes": 64,
        "duration_s": 1800,
        "steps": steps,
    }
    out = Path(__file__).resolve().parents[1] / "trainsentry" / "data" / "demo_incident.json.gz"
    raw = json.dumps(incident, separators=(",", ":")).encode() + b"\n"
    out.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(steps)} steps)")


if __name__ == "__main__":
    main()
