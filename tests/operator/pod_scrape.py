"""What Prometheus makes of a PodMonitor, without a Kubernetes cluster.

Two stand-ins, each following the named upstream code (behaviour, not copied code):

- `pod_targets(pod)`: the targets Prometheus' kubernetes_sd `role: pod` builds for one Pod
  (prometheus `discovery/kubernetes/pod.go`, `buildPod`): none while the pod has no IP; else
  one target per declared port of every container and init container (`__address__` =
  `<pod IP>:<port>`), and one port-free target (`__address__` = `<pod IP>`) per container that
  declares no port. Pod-level meta labels on every target, container/port ones per target.
- `scrape_configs(monitor)`: the scrape configs prometheus-operator generates for a PodMonitor
  (`pkg/prometheus/promcfg.go`, `generatePodMonitorConfig`), one per podMetricsEndpoint, with
  the pod's discovery replaced by `static_configs` so that the debian Prometheus (built
  without kubernetes_sd) can run them: running filter, selector keeps, the port keep of
  `port` / `portNumber` (`__meta_kubernetes_pod_container_port_number`), the `namespace`,
  `container`, `pod`, `job` labels, the endpoint's own relabelings, then address sharding.

A real Prometheus then applies the relabelings, deduplicates targets whose final label sets
are equal, and scrapes what is left.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

META = "__meta_kubernetes_"


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _join_host_port(ip: str, port: int | str) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


def pod_targets(pod: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every target (its full label set, `__address__` included) of one Pod."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ip = str(status.get("podIP") or "")
    if not ip:
        return []
    common = {
        f"{META}namespace": meta["namespace"],
        f"{META}pod_name": meta["name"],
        f"{META}pod_ip": ip,
        f"{META}pod_node_name": str(spec.get("nodeName") or ""),
        f"{META}pod_phase": str(status.get("phase") or ""),
        f"{META}pod_uid": str(meta.get("uid") or ""),
    }
    for key, value in (meta.get("labels") or {}).items():
        common[f"{META}pod_label_{_sanitize(key)}"] = value
        common[f"{META}pod_labelpresent_{_sanitize(key)}"] = "true"
    containers = [(c, False) for c in spec.get("containers") or []]
    containers += [(c, True) for c in spec.get("initContainers") or []]
    targets = []
    for container, init in containers:
        own = {
            f"{META}pod_container_name": container["name"],
            f"{META}pod_container_image": str(container.get("image") or ""),
            f"{META}pod_container_init": str(init).lower(),
        }
        ports = container.get("ports") or []
        if not ports:
            targets.append({**common, **own, "__address__": ip})
        for port in ports:
            number = str(port["containerPort"])
            targets.append(
                {
                    **common,
                    **own,
                    "__address__": _join_host_port(ip, number),
                    f"{META}pod_container_port_number": number,
                    f"{META}pod_container_port_name": str(port.get("name") or ""),
                    f"{META}pod_container_port_protocol": str(port.get("protocol") or "TCP"),
                }
            )
    return targets


_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "separator": "separator",
    "regex": "regex",
    "replacement": "replacement",
    "modulus": "modulus",
    "action": "action",
}


def _relabel(config: Mapping[str, Any]) -> dict[str, Any]:
    result = {_RELABEL_KEYS[key]: value for key, value in config.items()}
    if "action" in result:
        result["action"] = str(result["action"]).lower()
    return result


def _selector_relabelings(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    for key in sorted(selector.get("matchLabels") or {}):
        result.append(
            {
                "action": "keep",
                "source_labels": [
                    f"{META}pod_label_{_sanitize(key)}",
                    f"{META}pod_labelpresent_{_sanitize(key)}",
                ],
                "regex": f"({selector['matchLabels'][key]});true",
            }
        )
    for expression in selector.get("matchExpressions") or []:
        key, operator = _sanitize(expression["key"]), expression["operator"]
        values = "|".join(expression.get("values") or [])
        both = [f"{META}pod_label_{key}", f"{META}pod_labelpresent_{key}"]
        present = [f"{META}pod_labelpresent_{key}"]
        result.append(
            {
                "In": {"action": "keep", "source_labels": both, "regex": f"({values});true"},
                "NotIn": {"action": "drop", "source_labels": both, "regex": f"({values});true"},
                "Exists": {"action": "keep", "source_labels": present, "regex": "true"},
                "DoesNotExist": {"action": "drop", "source_labels": present, "regex": "true"},
            }[operator]
        )
    return result


def scrape_configs(
    monitor: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The scrape configs of a PodMonitor, discovering `pods` (those of its namespaces)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    namespaces = (spec.get("namespaceSelector") or {}).get("matchNames") or [meta["namespace"]]
    static: list[tuple[str, dict[str, str]]] = [
        (target.pop("__address__"), target)
        for pod in pods
        if pod["metadata"]["namespace"] in namespaces
        for target in pod_targets(pod)
    ]
    configs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        relabelings: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}
        ]
        if endpoint.get("filterRunning", True):
            relabelings.append(
                {
                    "action": "drop",
                    "source_labels": [f"{META}pod_phase"],
                    "regex": "(Failed|Succeeded)",
                }
            )
        relabelings += _selector_relabelings(spec["selector"])
        if endpoint.get("port"):
            relabelings.append(
                {
                    "action": "keep",
                    "source_labels": [f"{META}pod_container_port_name"],
                    "regex": endpoint["port"],
                }
            )
        elif endpoint.get("portNumber"):
            relabelings.append(
                {
                    "action": "keep",
                    "source_labels": [f"{META}pod_container_port_number"],
                    "regex": str(endpoint["portNumber"]),
                }
            )
        relabelings += [
            {"source_labels": [f"{META}namespace"], "target_label": "namespace"},
            {"source_labels": [f"{META}pod_container_name"], "target_label": "container"},
            {"source_labels": [f"{META}pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        ]
        if endpoint.get("port"):
            relabelings.append({"target_label": "endpoint", "replacement": endpoint["port"]})
        relabelings += [_relabel(item) for item in endpoint.get("relabelings") or []]
        relabelings += [  # one shard: the config reloader substitutes $(SHARD) with 0
            {
                "source_labels": ["__address__"],
                "target_label": "__tmp_hash",
                "modulus": 1,
                "action": "hashmod",
            },
            {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
        ]
        config: dict[str, Any] = {
            "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "honor_labels": False,
            "static_configs": [
                {"targets": [address], "labels": dict(labels)} for address, labels in static
            ],
            "relabel_configs": relabelings,
        }
        if endpoint.get("interval"):
            config["scrape_interval"] = endpoint["interval"]
        if endpoint.get("path"):
            config["metrics_path"] = endpoint["path"]
        configs.append(config)
    return configs
