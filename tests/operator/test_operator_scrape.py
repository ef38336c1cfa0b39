"""The rendered PodMonitor, run by a real Prometheus against real HTTP servers on pod IPs.

The pods' targets and the PodMonitor's scrape configs are built as kubernetes_sd and
prometheus-operator build them (pod_scrape.py); Prometheus does the relabelling, the
deduplication of equal targets and the scraping. Pod IPs are loopback addresses
(127.0.0.2, 127.0.0.3 and ::1 for IPv6), each with one server per rank on base + LOCAL_RANK.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from operator_harness import NS, Validator, pod
from pod_scrape import scrape_configs

from tests.support.realservers import (
    free_port,
    http_json,
    logs_on_error,
    start_prometheus,
    wait_for,
)
from trainsentry.operator.reconcile import Sources
from trainsentry.operator.render import render_children
from trainsentry.operator.spec import JobIdentity, TrainingJobSpec

JOB = JobIdentity(name="llm", namespace=NS, uid="0b5e6c1e-1111-4222-8333-944445555666")
POD_IPS = ("127.0.0.2", "127.0.0.3", "::1")
POD_NAMES = ("llm-worker-0", "llm-worker-1", "llm-worker-2")
NODES = ("gpu-1", "gpu-2", "gpu-3")
RANKS = 2


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = b"trainsentry_probe_up 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def _bind_all(base: int) -> list[ThreadingHTTPServer]:
    servers: list[ThreadingHTTPServer] = []
    try:
        for ip in POD_IPS:
            kind = _Server6 if ipaddress.ip_address(ip).version == 6 else _Server
            for rank in range(RANKS):
                servers.append(kind((ip, base + rank), _Metrics))
    except OSError:
        for server in servers:
            server.server_close()
        raise
    return servers


@contextlib.contextmanager
def probe_servers() -> Iterator[int]:
    """One metrics server per pod IP and rank; yields the base port."""
    for _ in range(20):
        base = free_port()
        try:
            servers = _bind_all(base)
        except OSError:
            continue
        break
    else:
        raise RuntimeError("no free pair of ports on the pod IPs")
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield base
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def training_pods(base: int) -> list[dict[str, Any]]:
    """Pods as a PyTorchJob makes them: the trainer declares no probe port, or one rank's, or
    all; sidecars and init containers come with or without ports of their own."""
    bare = pod(POD_NAMES[0], "llm", NODES[0])
    bare["spec"]["containers"] = [
        {"name": "pytorch", "image": "trainer:1"},
        {"name": "istio-proxy", "image": "proxy:1", "ports": [{"containerPort": 15090}]},
    ]
    bare["spec"]["initContainers"] = [{"name": "init", "image": "init:1"}]
    partly = pod(POD_NAMES[1], "llm", NODES[1])
    partly["spec"]["containers"] = [
        {
            "name": "pytorch",
            "image": "trainer:1",
            "ports": [
                {"containerPort": base, "name": "probe"},  # one rank's port only
                {"containerPort": 23456, "name": "c10d"},
            ],
        },
        {"name": "logger", "image": "logger:1"},
    ]
    declared = pod(POD_NAMES[2], "llm", NODES[2])  # IPv6, every probe port declared
    declared["spec"]["containers"][0]["ports"] = [
        {"containerPort": base + rank, "name": f"probe-{rank}"} for rank in range(RANKS)
    ]
    pods = [bare, partly, declared]
    for item, ip in zip(pods, POD_IPS, strict=True):
        item["status"]["podIP"] = ip
    return pods


@pytest.mark.e2e  # starts a real Prometheus
def test_every_rank_is_scraped_once_whether_or_not_its_port_is_declared(
    sources: Sources, tmp_path: Path
) -> None:
    with probe_servers() as base:
        spec = TrainingJobSpec.model_validate(
            {
                "selector": {"matchLabels": {"job": "llm"}},
                "ranksPerPod": RANKS,
                "probe": {"port": base, "interval": "1s"},
            }
        )
        pods = training_pods(base)
        validator = Validator()
        for item in pods:
            validator(item)
        rendered = render_children(JOB, spec, sources.rule_files, (), [])
        monitor = next(m for m in rendered.manifests if m["kind"] == "PodMonitor")
        validator(monitor)  # still valid against the prometheus-operator CRD schema

        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": scrape_configs(monitor, pods),
        }
        with start_prometheus(tmp_path, config) as prom, logs_on_error(prom):
            expected = sorted(
                (name, f"[{ip}]:{base + rank}" if ":" in ip else f"{ip}:{base + rank}")
                for name, ip in zip(POD_NAMES, POD_IPS, strict=True)
                for rank in range(RANKS)
            )

            def scraped() -> list[dict[str, Any]] | None:
                active = http_json(f"{prom.url}/api/v1/targets?state=active")["data"]
                targets: list[dict[str, Any]] = active["activeTargets"]
                up = [t for t in targets if t["health"] == "up"]
                return targets if len(up) >= len(expected) else None

            try:
                targets = wait_for(scraped, 20, "every rank's probe to be scraped")
            except AssertionError:
                targets = http_json(f"{prom.url}/api/v1/targets?state=active")["data"][
                    "activeTargets"
                ]
                raise AssertionError(
                    f"targets: {[(t['labels'], t['health']) for t in targets]}"
                ) from None

            # Exactly one target per pod and rank (no duplicates from other containers or
            # ports), each on the pod's IP and the rank's port, all scraped.
            got = sorted(
                (t["labels"]["pod"], urllib.parse.urlsplit(t["scrapeUrl"]).netloc) for t in targets
            )
            assert got == expected
            for target in targets:
                labels = target["labels"]
                assert target["health"] == "up", target
                assert target["scrapeUrl"].endswith("/metrics")
                assert labels["trainingjob"] == "llm" and labels["namespace"] == NS
                assert labels["node"] == dict(zip(POD_NAMES, NODES, strict=True))[labels["pod"]]
                assert labels["instance"] == urllib.parse.urlsplit(target["scrapeUrl"]).netloc
                assert "container" not in labels, labels  # would split one rank in two

            series = http_json(
                f"{prom.url}/api/v1/query?query="
                + urllib.parse.quote('count(up{trainingjob="llm"} == 1)')
            )["data"]["result"]
            assert series and series[0]["value"][1] == str(len(expected))
