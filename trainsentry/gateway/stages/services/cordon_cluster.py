"""The cordon's Kubernetes calls (I/O), for gateway/stages/services/cordon.py: where the jobs
run, and the cordon and uncordon themselves.

Invariants:
- the calls are: list TrainingJobs (all namespaces: their `status.nodes`, which the share
  guard and the card's jobs read), patch the Node (`spec.unschedulable`), create an Event on
  it (namespace `default`), and set the `NodeCordoned` condition on each job of the node
  (read-modify-write of `status.conditions` with the resourceVersion: a merge patch
  replaces the whole list). RBAC: trainingjobs list and get, trainingjobs/status patch,
  nodes patch (never get: the patch answers the Node, whose uid the Event names, and 404
  for a missing one), events create;
- never called inside a store transaction (the stage calls it between its transactions);
- a TrainingJob's `status.nodes` is attacker-controlled: only short printable strings, at
  most MAX_LISTED per job; a job without them lists nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from trainsentry.kube.client import Kube, KubeError, LazyApiClient
from trainsentry.kube.events import event
from trainsentry.kube.names import InvalidName
from trainsentry.kube.resources import EVENTS, NODES, TRAININGJOBS

log = logging.getLogger("trainsentry.cordon")

CONDITION = "NodeCordoned"
MAX_LISTED = 10_000  # nodes taken from one TrainingJob's status.nodes
PAGE = 500  # TrainingJobs per list request
MAX_PAGES = 40  # 20,000 TrainingJobs at most


def with_node_condition(
    conditions: Sequence[Mapping[str, Any]], cordoned: bool, message: str, now: str
) -> list[dict[str, Any]]:
    """Pure: `status.conditions` with NodeCordoned set (other conditions kept as they are)."""
    mine = {
        "type": CONDITION,
        "status": "True" if cordoned else "False",
        "reason": "NodeCordoned" if cordoned else "NodeUncordoned",
        "message": message[:1000],
        "lastTransitionTime": now,
    }
    return [dict(c) for c in conditions if c.get("type") != CONDITION] + [mine]


def listed_nodes(body: Mapping[str, Any]) -> list[str]:
    """Pure: a TrainingJob's `status.nodes`, names that are not short printable text left out."""
    nodes = (body.get("status") or {}).get("nodes") or []
    if not isinstance(nodes, list):
        return []
    return [
        n
        for n in nodes[:MAX_LISTED]
        if isinstance(n, str) and 0 < len(n) <= 253 and n.isprintable()
    ]


def api_problem(exc: Exception) -> str:
    """The Kubernetes API's failure in words, without its body (no secrets, bounded)."""
    if isinstance(exc, KubeError):
        return f"Kubernetes API answered {exc.status}"
    if isinstance(exc, InvalidName):  # refused by the client, before any request
        return str(exc)[:300]
    return f"Kubernetes API unreachable ({type(exc).__name__})"


class Cluster:
    def __init__(
        self, api_factory: Callable[[], Awaitable[Any]], clock: Callable[[], datetime]
    ) -> None:
        self._api = LazyApiClient(api_factory)
        self._clock = clock

    async def close(self) -> None:
        await self._api.close()

    async def _kube(self) -> Kube:
        return Kube(await self._api.get())

    async def job_nodes(self) -> dict[str, list[str]] | None:
        """`namespace/name` -> the nodes each TrainingJob lists in `status.nodes`, every
        namespace, PAGE at a time; None when they cannot all be listed (an error, or more
        than PAGE * MAX_PAGES jobs; logged: the share guard then refuses)."""
        found: dict[str, list[str]] = {}
        token: str | None = None
        try:
            kube = await self._kube()
            for _ in range(MAX_PAGES):
                bodies, token = await kube.list_page(TRAININGJOBS, None, limit=PAGE, token=token)
                for body in bodies:
                    meta = body.get("metadata") or {}
                    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
                    if namespace and name:
                        found[f"{namespace}/{name}"] = listed_nodes(body)
                if token is None:
                    return found
        except Exception as exc:  # the API's answer, or it is unreachable
            log.warning("cordon: TrainingJobs not listed error=%s", api_problem(exc))
            return None
        log.warning("cordon: TrainingJobs not listed: more than %d", PAGE * MAX_PAGES)
        return None

    async def cordon(self, node: str, who: str, jobs: Sequence[str]) -> str:
        """Cordons the node; "" when done, else why not (the API's answer)."""
        return await self._set(node, True, who, jobs)

    async def uncordon(self, node: str, who: str, jobs: Sequence[str]) -> str:
        """Makes the node schedulable again; "" when done, else why not."""
        return await self._set(node, None, who, jobs)

    async def _set(self, node: str, cordoned: bool | None, who: str, jobs: Sequence[str]) -> str:
        reason = "Cordoned" if cordoned else "Uncordoned"
        try:
            kube = await self._kube()
            body = await self._patch_node(kube, node, cordoned)
            if body is None:
                return f"no node {node} in the cluster"
            await kube.create(EVENTS, "default", self._event(body, reason, who))
        except Exception as exc:  # the API's answer, or it is unreachable
            return api_problem(exc)
        message = f"node {node} {reason.lower()} by {who}"
        await self._job_conditions(kube, jobs, bool(cordoned), message)
        return ""

    @staticmethod
    async def _patch_node(
        kube: Kube, node: str, unschedulable: bool | None
    ) -> dict[str, Any] | None:
        """Sets `spec.unschedulable` (None removes it) and answers the patched Node, or None
        when there is no such Node. A merge patch never creates one, so this needs no `get`."""
        try:
            return await kube.patch(NODES, None, node, {"spec": {"unschedulable": unschedulable}})
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def _job_conditions(
        self, kube: Kube, jobs: Sequence[str], cordoned: bool, message: str
    ) -> None:
        for job in jobs:
            namespace, _, name = job.partition("/")
            if not (namespace and name):
                continue
            try:
                await kube.rewrite_conditions(
                    TRAININGJOBS,
                    namespace,
                    name,
                    lambda conditions, _meta: with_node_condition(
                        conditions, cordoned, message, self._now()
                    ),
                )
            except Exception as exc:  # the node stands as it is; the condition is a courtesy
                log.warning("cordon: condition not written job=%s error=%s", job, api_problem(exc))

    def _event(self, node: Mapping[str, Any], reason: str, who: str) -> dict[str, Any]:
        meta = node.get("metadata") or {}
        involved = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": str(meta.get("name", "")),
            "uid": str(meta.get("uid", "")),
        }
        message = f"{reason} by {who[:200]} (trainsentry node health)"
        return event(
            involved,
            "default",
            reason,
            message,
            warning=reason == "Cordoned",
            component="trainsentry-gateway",
            at=self._clock(),
        )

    def _now(self) -> str:
        return self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
