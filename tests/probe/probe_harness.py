"""Helpers for the probe tests: run a real multi-process gloo job and read its probes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rules.jobscope import render_for_job

from tests.support.ports import free_port
from trainsentry.assets import rules_dir

WORKER = Path(__file__).with_name("train_worker.py")
REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-probe-token-1234"


Sample = tuple[str, dict[str, str], float]


def scrape(port: int, timeout: float = 3.0) -> list[Sample]:
    """All samples from a probe's /metrics over real HTTP."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=timeout).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    for sample_name, sample_labels, sample_value in samples:
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
            return sample_value
    return None


@dataclass
class GlooJob:
    """A running N-rank gloo job launched through the probe's launcher hook."""

    processes: list[subprocess.Popen[bytes]]
    ports: dict[int, int] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
        for proc in self.processes:
            proc.wait(timeout=10)

    def output(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')}" for p in self.logs)


def launch_job(
    tmp_path: Path,
    world_size: int,
    extra_env: Mapping[str, str],
    start_timeout: float = 60.0,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
) -> GlooJob:
    master_port = free_port()
    port_dir = tmp_path / "ports"
    port_dir.mkdir(parents=True)
    base_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(world_size),
        "TRAINSENTRY_PROBE": "1",
        "TRAINSENTRY_PROBE_PORT": "0",
        "TRAINSENTRY_PROBE_BIND": "127.0.0.1",
        "TRAINSENTRY_PROBE_INTERVAL": "0.3",
        "TRAINSENTRY_PROBE_TOKEN": TOKEN,
        "TRAINSENTRY_JOB": "llama",
        "TRAINSENTRY_NAMESPACE": "team-a",
        "PORT_DIR": str(port_dir),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        **extra_env,
    }
    job = GlooJob(processes=[])
    for rank in range(world_size):
        log_path = tmp_path / f"rank{rank}.log"
        job.logs.append(log_path)
        env = {
            **base_env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "TRAINSENTRY_NODE": f"node-{rank // 2}",
            "POD_NAME": f"llama-w-{rank}",
            **(rank_env or {}).get(rank, {}),
        }
        with log_path.open("wb") as log:
            job.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trainsentry.probe.launch", str(WORKER)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline and len(job.ports) < world_size:
        for rank in range(world_size):
            path = port_dir / f"port.{rank}"
            if rank not in job.ports and path.exists():
                job.ports[rank] = int(path.read_text())
        if any(p.poll() is not None for p in job.processes):
            break
        time.sleep(0.1)
    if len(job.ports) < world_size:
        job.stop()
        raise RuntimeError("gloo job did not start:\n" + job.output())
    return job


def prometheus_for_job(
    job: GlooJob, tmp_path: Path, alertmanager: str | None = None
) -> tuple[dict[str, Any], list[Path]]:
    """Prometheus config and rule files: the shipped training rules rendered for the job with
    short thresholds, scraping every rank's probe."""
    document = yaml.safe_load((rules_dir() / "training.yaml").read_text())
    rendered = render_for_job(
        document,
        "team-a",
        "llama",
        thresholds={"hang_seconds": "3", "rank_stall_seconds": "2"},
        for_override="0s",
    )
    # Stand-in for the operator's membership rule (kube_pod_info is not there outside k8s).
    membership = {
        "groups": [
            {
                "name": "membership",
                "rules": [
                    {
                        "record": "trainsentry:job_pod:info",
                        "expr": "max by (namespace, pod) (trainsentry_probe_info) * 0 + 1",
                        "labels": {"trainingjob": "llama"},
                    }
                ],
            }
        ]
    }
    rule_files = [tmp_path / "training.yaml", tmp_path / "membership.yaml"]
    rule_files[0].write_text(yaml.safe_dump(rendered, sort_keys=False))
    rule_files[1].write_text(yaml.safe_dump(membership, sort_keys=False))
    targets = [
        {
            "targets": [f"127.0.0.1:{job.ports[rank]}"],
            "labels": {"namespace": "team-a", "pod": f"llama-w-{rank}"},
        }
        for rank in sorted(job.ports)
    ]
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "team-a/llama-trainsentry-probe", "static_configs": targets}
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config, rule_files
