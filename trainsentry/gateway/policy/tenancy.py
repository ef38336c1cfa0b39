"""Tenancy: whose evidence an alert is (pure: no I/O, no clock).

On a shared cluster each team writes PrometheusRules in its own namespace and shapes its
own labels, so an alert is a stranger's input (docs/alerts.md "Trusted evidence"). What a
tenant sends may change its own incidents only; effects across jobs or namespaces
(correlation into another job's incident, leading it, blinding its resolution) come only
from trusted evidence.

Trusted evidence is an alert without a `namespace` label. Why a tenant cannot forge that on
a cluster set up as docs/alerts.md says: prometheus-operator's `enforcedNamespaceLabel:
namespace` sets `namespace=<the PrometheusRule's namespace>` on every alert of every rule
not listed in `excludedFromEnforcement` (and overwrites a rule label that says otherwise);
only the chart's cluster-wide rules are excluded, and their alerts carry no `namespace`
(what the admin sets for that: docs/alerts.md). A tenant's alert therefore always names
its own, non-empty namespace.

An alert's realm is what it may touch: "" (`CLUSTER_REALM`) for trusted evidence, else its
job (`storm.job_key`: `trainingjob:<namespace>/<name>`, or `job:<namespace>/<scrape job>`
for a namespace's alert of no TrainingJob). Invariant: the realm of a tenant's alert always
contains its own namespace, so no label a tenant sets names another team's realm.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainsentry.gateway.policy.storm import job_key
from trainsentry.labels import NAMESPACE_LABEL

CLUSTER_REALM = ""  # the realm of trusted, cluster-wide evidence


def trusted(labels: Mapping[str, str]) -> bool:
    """Pure: whether the alert is trusted cluster-wide evidence (no `namespace` label)."""
    return not labels.get(NAMESPACE_LABEL, "")


def realm_of(labels: Mapping[str, str]) -> str:
    """Pure: the realm an alert's evidence counts in: `CLUSTER_REALM` when trusted, else its
    own job's key (which names its namespace)."""
    return CLUSTER_REALM if trusted(labels) else job_key(labels)


def realm_key(key: str, realm: str) -> str:
    """Pure: a failure-domain index entry (`node=<node>`) as one realm sees it: the entry
    itself for the cluster's, `<key>@<realm>` for a tenant's (its own incidents only)."""
    return key if realm == CLUSTER_REALM else f"{key}@{realm}"
