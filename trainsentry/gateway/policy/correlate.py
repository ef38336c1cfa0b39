"""Failure domains: which alerts of other groups belong to a node's incident, and which of
an incident's alerts is its cause (pure: no I/O, no clock).

A node's death raises many alerts that name it (a GPU fault, NotReady, its exporters'
`up`, its ranks' probes) and job-level ones that do not (the job's NCCL RAS and hang
alerts). With `policy.correlation.enabled` they are one incident (incident.py
`IncidentBook.place`):
- an alert of the failure-domain vocabulary (`rank` below FOREIGN) that names a node joins
  the open incident of that node's first such alert, whatever its alertname and group (the
  first opens its incident as `grouping` says: 160 nodes' XID 79 in one group stay one);
- a job-level consequence (no node) joins the incident of a node its job has ranks on
  (learnt from the job's alerts that name both), if that incident gathered an alert within
  `correlation.window`;
- anything else (a full disk, a hot GPU) keeps its `grouping` incident.

The cause is chosen by `CAUSE_ORDER` (a hardware fault, then the node NotReady, then an
exporter down, then the consequences), the earliest of the best rank, and chosen again when
a better one joins. Invariant: `rank` depends on the alert and its classification only.

Resolution needs positive evidence: an alert of a node whose reporting target is down
(`BLINDERS` firing for that node) cannot say it resolved; its resolution is "unknown" until
the target is back. A hardware fault's resolution also waits `correlation.confirm_resolved`
seconds for the node to prove alive, since a dead node's series go stale (and resolve the
alert) before its exporters' `up` alerts can fire.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainsentry.alerts import Alert, Priority
from trainsentry.gateway.policy.classify import Classification, sentence
from trainsentry.gateway.policy.infra import hardware_component
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.tenancy import CLUSTER_REALM, realm_key, realm_of

FAULT, NODE_DOWN, EXPORTER_DOWN, CONSEQUENCE, FOREIGN = range(5)
CAUSE_ORDER = ("hardware fault", "node NotReady", "exporter down", "consequence", "other")
NODE_DOWN_NAMES = frozenset({"KubeNodeNotReady"})
EXPORTER_DOWN_NAMES = frozenset({"NodeExporterDown", "DCGMExporterDown"})
# Alerts a lost node or its job's lost ranks raise; the job's pods restarting or evicted.
CONSEQUENCE_PREFIXES = ("TrainingProbe", "NCCLRas", "TrainingJob", "TrainingRank", "KubeJobPod")
# The alerts that say a node's reporting target is down -> the `component`s it reports
# (None: every alert of the node).
BLINDERS: Mapping[str, frozenset[str] | None] = {
    "KubeNodeNotReady": None,
    "NodeExporterDown": frozenset({"node", "fabric"}),
    "DCGMExporterDown": frozenset({"gpu"}),
}
NODE_DOMAIN = "node="
JOB_DOMAIN = "job="
BLAST_RADIUS = "blast-radius"  # classify.py's rule id of the raise


def own_priority(classification: Classification) -> Priority:
    """Pure: the alert's priority before the blast-radius raise (20 nodes' full disks are
    P0 as a pool, yet no node's hardware fault)."""
    own = [s.priority for s in classification.steps if s.rule_id != BLAST_RADIUS]
    return min(own, key=lambda p: p.level) if own else classification.priority


def without_blast_radius(classification: Classification) -> Classification:
    """Pure: the classification as it was before the blast-radius raise (the same object
    when it was not raised)."""
    steps = tuple(s for s in classification.steps if s.rule_id != BLAST_RADIUS)
    if not steps or len(steps) == len(classification.steps):
        return classification
    return Classification(
        priority=own_priority(classification),
        rule_id=steps[-1].rule_id,
        reason=sentence("; ".join(step.reason for step in steps)),
        steps=steps,
    )


def rank(alert: Alert, classification: Classification, policy: Policy) -> int:
    """Pure: the alert's place in `CAUSE_ORDER` (FOREIGN: not in a failure domain's
    vocabulary, it keeps its `grouping` incident). A fault is a hardware alert
    (`infra.hardware_component`: a hardware `component`, a known XID) that is P0 on its
    own (`own_priority`): the GPU fell off the bus, an uncorrectable ECC error, an IB link
    down; not a hot GPU, a full disk or an application XID."""
    name = alert.name
    if name in NODE_DOWN_NAMES:
        return NODE_DOWN
    if name in EXPORTER_DOWN_NAMES:
        return EXPORTER_DOWN
    if name.startswith(CONSEQUENCE_PREFIXES):
        return CONSEQUENCE
    if hardware_component(alert, policy) and own_priority(classification) is Priority.P0:
        return FAULT
    return FOREIGN


def node_keys(alert: Alert) -> list[str]:
    """Pure: the node index entries an alert looks up, in order (none without a node): its
    own realm's (tenancy.py: a tenant's alert finds its own job's incidents of the node),
    then the cluster's (trusted evidence's incident of the node, which a job's alert may
    join). A tenant never finds another tenant's incident through a node. The node is
    `Alert.node` (the policy's `node_labels`, as the store resolved it)."""
    node = alert.node
    if not node:
        return []
    realm = realm_of(alert.labels)
    keys = [realm_key(NODE_DOMAIN + node, realm)]
    if realm != CLUSTER_REALM:
        keys.append(NODE_DOMAIN + node)
    return keys


def domain_keys(alert: Alert) -> list[str]:
    """Pure: the failure-domain index entries an alert looks up (node, then job)."""
    keys = node_keys(alert)
    if job := alert.job:  # a TrainingJob; a cluster-wide alert's scrape `job` is none
        keys.append(JOB_DOMAIN + job.key)
    return keys


def blinds(blinder: str, alert: Alert) -> bool:
    """Pure: whether the `blinder` alert firing for a node means the node's `alert` cannot
    be seen to resolve (its reporting target is down). Blinders never blind each other."""
    if alert.name in BLINDERS or blinder not in BLINDERS:
        return False
    components = BLINDERS[blinder]
    return components is None or alert.labels.get("component", "") in components
