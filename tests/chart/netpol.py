"""Kubernetes NetworkPolicy ingress semantics as kubernetes.io documents them ("Network
Policies"), small and pure, to ask the chart's rendered policies who may reach what.

- A pod is isolated for ingress when a NetworkPolicy of its namespace selects it
  (`spec.podSelector`; `{}` selects every pod there) and its `policyTypes` holds Ingress
  (absent `policyTypes`: Ingress always). A pod no policy isolates takes every connection.
- An isolated pod takes a connection that some selecting policy's ingress rule allows; the
  rules of all selecting policies are ORed (policies are additive).
- A rule allows a connection when its `from` allows the source (absent or empty: every
  source) and its `ports` allow the port (absent or empty: every port).
- A `from` peer: `podSelector` alone selects pods in the policy's own namespace;
  `namespaceSelector` alone every pod of the selected namespaces; both in ONE peer the
  selected pods in the selected namespaces (AND); an `ipBlock` a CIDR, minus `except`
  (for cluster-external addresses; pod IPs are matched by the selectors).
- A port entry: `protocol` (default TCP) and `port`, a number or the name of a container
  port of the destination pod (named ports), up to `endPort` when given; no `port`: every
  port of that protocol.

Label selectors are the operator's `LabelSelector.matches` (one meaning of a selector).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsentry.operator.spec import LabelSelector


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = ""
    # name -> (port, protocol) of the pod's named container ports
    named_ports: Mapping[str, tuple[int, str]] = field(default_factory=dict)

    def ns_labels(self) -> Mapping[str, str]:
        """Namespace labels; Kubernetes always sets kubernetes.io/metadata.name."""
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def workload_pod(obj: Mapping[str, Any], namespace: str) -> Pod:
    """The pod of a rendered workload (Deployment, DaemonSet, CronJob) as the evaluator sees
    it: its template's labels and named container ports."""
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    template = spec["template"]
    ports = {
        p["name"]: (int(p["containerPort"]), str(p.get("protocol", "TCP")))
        for c in template["spec"]["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }
    return Pod(namespace, dict(template["metadata"]["labels"]), named_ports=ports)


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    return LabelSelector.model_validate(selector or {}).matches(labels)


def _isolating(policies: Iterable[Mapping[str, Any]], dest: Pod) -> list[Mapping[str, Any]]:
    found = []
    for policy in policies:
        if (policy.get("metadata") or {}).get("namespace") != dest.namespace:
            continue
        spec = policy.get("spec") or {}
        if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
            continue
        if selects(spec.get("podSelector"), dest.labels):
            found.append(policy)
    return found


def _peer_allows(peer: Mapping[str, Any], policy_ns: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        if not source.ip:
            return False
        address = ipaddress.ip_address(source.ip)
        block = peer["ipBlock"]
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(e) for e in block.get("except") or [])
    has_pods, has_ns = "podSelector" in peer, "namespaceSelector" in peer
    if has_ns:
        if not selects(peer["namespaceSelector"], source.ns_labels()):
            return False
    elif source.namespace != policy_ns:
        return False
    return not has_pods or selects(peer["podSelector"], source.labels)


def _port_allows(entry: Mapping[str, Any], port: int, protocol: str, dest: Pod) -> bool:
    if str(entry.get("protocol") or "TCP") != protocol:
        return False
    wanted = entry.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str) and not wanted.isdigit():
        named = dest.named_ports.get(wanted)
        return named is not None and named == (port, protocol)
    start = int(wanted)
    return start <= port <= int(entry.get("endPort") or start)


def allowed(
    policies: Sequence[Mapping[str, Any]],
    source: Pod,
    dest: Pod,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether `source` may open a connection to `dest` on `port` (ingress side only)."""
    isolating = _isolating(policies, dest)
    if not isolating:
        return True
    for policy in isolating:
        policy_ns = policy["metadata"]["namespace"]
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            peers = rule.get("from") or []
            if peers and not any(_peer_allows(p, policy_ns, source) for p in peers):
                continue
            ports = rule.get("ports") or []
            if ports and not any(_port_allows(e, port, protocol, dest) for e in ports):
                continue
            return True
    return False
