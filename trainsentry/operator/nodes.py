"""Node labelling for the shared exporters. Pure: node metadata in, merge patch out.

Exporter DaemonSets run once per node, not once per job. A TrainingJob *claims* each node its
pods run on by writing an annotation `claims.trainsentry.io/<job uid>` on the Node (value: the
job and the exporters it wants). The labels follow from the set of claims:

- `trainsentry.io/monitored: "true"` while any claim exists;
- `trainsentry.io/exporter-<name>: "true"` while any claim wants that exporter.

Claims live on the Node itself, so several jobs can share a node, a restarted operator needs
no memory, and a label is removed only when the last claim goes. Patches carry the Node's
`resourceVersion`, so two jobs changing the same node concurrently conflict (409) instead of
overwriting each other; the caller re-reads and retries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CLAIM_PREFIX = "claims.trainsentry.io/"
MONITORED_LABEL = "trainsentry.io/monitored"
EXPORTER_LABEL_PREFIX = "trainsentry.io/exporter-"
EXPORTERS = ("dcgm", "infiniband", "node")


@dataclass(frozen=True)
class Claim:
    job_uid: str
    job_key: str  # namespace/name, for humans reading the node
    exporters: tuple[str, ...]

    @property
    def annotation(self) -> str:
        return CLAIM_PREFIX + self.job_uid

    def value(self) -> str:
        return json.dumps(
            {"job": self.job_key, "exporters": list(self.exporters)},
            sort_keys=True,
            separators=(",", ":"),
        )


def claims_on(annotations: Mapping[str, str]) -> dict[str, list[str]]:
    """job uid → exporters wanted, from a Node's annotations (malformed values: all off)."""
    result: dict[str, list[str]] = {}
    for key, value in annotations.items():
        if not key.startswith(CLAIM_PREFIX):
            continue
        try:
            exporters = json.loads(value).get("exporters", [])
        except (ValueError, AttributeError):
            exporters = []
        result[key[len(CLAIM_PREFIX) :]] = [str(item) for item in exporters]
    return result


def labels_for(claims: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """The trainsentry labels a node with these claims must carry."""
    if not claims:
        return {}
    labels = {MONITORED_LABEL: "true"}
    wanted = {exporter for exporters in claims.values() for exporter in exporters}
    for exporter in EXPORTERS:
        if exporter in wanted:
            labels[EXPORTER_LABEL_PREFIX + exporter] = "true"
    return labels


def _ours(key: str) -> bool:
    return key == MONITORED_LABEL or key.startswith(EXPORTER_LABEL_PREFIX)


def node_patch(node: Mapping[str, Any], job_uid: str, claim: Claim | None) -> dict[str, Any] | None:
    """The merge patch that sets (claim) or drops (None) this job's claim; None: no change."""
    meta = node.get("metadata") or {}
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    labels: dict[str, str] = dict(meta.get("labels") or {})
    key = CLAIM_PREFIX + job_uid
    new_annotations = dict(annotations)
    if claim is None:
        new_annotations.pop(key, None)
    else:
        new_annotations[key] = claim.value()
    current = {k: v for k, v in labels.items() if _ours(k)}
    desired = labels_for(claims_on(new_annotations))
    if new_annotations == annotations and current == desired:
        return None
    patch_meta: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
    if new_annotations != annotations:
        patch_meta["annotations"] = {key: new_annotations.get(key)}
    if current != desired:
        patch_meta["labels"] = {
            **{k: None for k in current if k not in desired},
            **desired,
        }
    return {"metadata": patch_meta}


def claimed_by(node: Mapping[str, Any], job_uid: str) -> bool:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return CLAIM_PREFIX + job_uid in annotations
