"""The label `trainsentry.io/trainingjobs: "true"` on each namespace that holds a TrainingJob,
which the chart's selectors read: the admission webhook's `namespaceSelector` (it is called
for the pods of those namespaces only) and the gateway's NetworkPolicy (hang triggers from
those namespaces' job pods only). docs/operator.md, "Which pods the webhook sees".

Invariants:
- Set on every reconcile of a job whose namespace is not known labelled in this process (a
  merge patch of that one label: nothing else of the namespace is read or written).
- Taken off when the namespace's last TrainingJob is deleted; a namespace an admin labels
  ahead of its first job keeps the label until then.
- Failing soft: an API error is logged and tried again at the next reconcile.
"""

from __future__ import annotations

import logging

from trainsentry.kube.client import Kube, KubeError
from trainsentry.kube.resources import NAMESPACES, TRAININGJOBS

log = logging.getLogger(__name__)

NAMESPACE_LABEL = "trainsentry.io/trainingjobs"


class NamespaceLabels:
    """Which namespaces this process labelled (module docstring)."""

    def __init__(self) -> None:
        self._labelled: set[str] = set()

    async def holds_jobs(self, kube: Kube, namespace: str) -> None:
        """Labels `namespace` unless this process did already."""
        if namespace in self._labelled:
            return
        await self._set(kube, namespace, "true")

    async def job_gone(self, kube: Kube, namespace: str) -> None:
        """After a job's deletion: unlabels `namespace` when no TrainingJob is left in it."""
        try:
            jobs = await kube.list(TRAININGJOBS, namespace)
        except KubeError as exc:
            log.warning("event=namespace_unlabel_failed namespace=%s error=%r", namespace, str(exc))
            return
        if any(not (j.get("metadata") or {}).get("deletionTimestamp") for j in jobs):
            return
        await self._set(kube, namespace, None)

    async def _set(self, kube: Kube, namespace: str, value: str | None) -> None:
        update = {"metadata": {"labels": {NAMESPACE_LABEL: value}}}
        try:
            await kube.patch(NAMESPACES, None, namespace, update)
        except KubeError as exc:
            log.warning("event=namespace_label_failed namespace=%s error=%r", namespace, str(exc))
            return
        if value is None:
            self._labelled.discard(namespace)
        else:
            self._labelled.add(namespace)
        log.info("event=namespace_labelled namespace=%s holds_jobs=%s", namespace, bool(value))
