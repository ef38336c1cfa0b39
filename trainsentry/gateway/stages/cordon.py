"""Cordon with a human in the loop (I/O): recommends sick nodes, cordons the approved ones
through the Kubernetes API, uncordons on request. Decisions are pure
(gateway/policy/cordon.py); this module reads the store and the cluster and writes both.

Invariants:
- one recommendation per node until it is decided (approved, dismissed): every check and
  every decision runs in one store transaction under the cordon lock row (store/cordon.py),
  so replicas decide one after the other; the card's idempotency key names the node and
  the decision it follows, so a repeated check writes nothing twice;
- a cordon is done only when the guards allow it, checked under the same lock; it is
  reserved in the store (status cordoned) before the cluster is called, and the cluster is
  called outside any store transaction (SQLite's single writer is never held by it); a failed
  call puts the recommendation back;
- the cluster writes are: patch the Node (`spec.unschedulable`), create an Event on it
  (namespace `default`), and set the `NodeCordoned` condition on each TrainingJob whose
  alerts named the node (read-modify-write of `status.conditions` with the
  resourceVersion: a merge patch replaces the whole list). RBAC: nodes patch (never get:
  the patch answers the Node, whose uid the Event names, and 404 for a missing one), events
  create, trainingjobs get (their `status.nodes`, the conditions' read) and trainingjobs/status
  patch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from trainsentry.alerts import Alert, AlertStatus, NotificationDraft, Priority
from trainsentry.gateway.policy.cordon import (
    Candidate,
    CordonSettings,
    Mode,
    NodeDecision,
    Status,
    blocked,
    candidates,
    job_nodes_of,
    summary,
    with_listed_nodes,
)
from trainsentry.gateway.policy.route import CHANNEL_KINDS
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.stages.topology import TopologySource
from trainsentry.kube.client import Kube, KubeError, LazyApiClient
from trainsentry.kube.events import event
from trainsentry.kube.names import InvalidName, subdomain_problems
from trainsentry.kube.resources import EVENTS, NODES, TRAININGJOBS
from trainsentry.store.cordon import SCOPE, cordon_states, lock_cordon
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.node_health import node_occurrences
from trainsentry.store.policy_state import load_states, save_states
from trainsentry.store.writes import insert_notifications
from trainsentry.tasks import OwnedTask, every

log = logging.getLogger("trainsentry.cordon")

KIND = "cordon"
CONDITION = "NodeCordoned"
PRIORITY = Priority.P1
CARD_CHANNELS = frozenset({*CHANNEL_KINDS["feishu"], "console"})
MAX_JOBS_READ = 20  # TrainingJobs read for one decision (a card names at most 20)
MAX_LISTED = 10_000  # nodes taken from one TrainingJob's status.nodes
MAX_REFUSED_LOGGED = 1_000  # refused node labels remembered, so each is logged once


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    message: str
    decision: NodeDecision | None = None  # the node's new state, when ok


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


def _api_problem(exc: Exception) -> str:
    """The Kubernetes API's failure in words, without its body (no secrets, bounded)."""
    if isinstance(exc, KubeError):
        return f"Kubernetes API answered {exc.status}"
    if isinstance(exc, InvalidName):  # refused by the client, before any request
        return str(exc)[:300]
    return f"Kubernetes API unreachable ({type(exc).__name__})"


class Cordoner:
    def __init__(
        self,
        engine: Engine,
        settings: CordonSettings,
        policy: Policy,
        api_factory: Callable[[], Awaitable[Any]],
        channels: Collection[str],
        *,
        topology: TopologySource | None = None,
        clock: Callable[[], datetime],
        on_drafts: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self._engine = engine
        self._policy = policy
        self._api = LazyApiClient(api_factory)
        self._channels = sorted(CARD_CHANNELS & set(channels))
        self._topology = topology
        self._clock = clock
        self._on_drafts = on_drafts
        self._refused: set[str] = set()  # node labels already logged as no node name
        self._task = OwnedTask(
            "cordon",
            lambda: every(
                self.settings.check_seconds,
                self.run_once,
                log,
                "cordon: this check failed, trying again",
            ),
        )

    # running -----------------------------------------------------------------------------

    def start(self) -> None:
        if self.settings.cordon is not Mode.OFF:
            self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        await self._api.close()

    async def _kube(self) -> Kube:
        return Kube(await self._api.get())

    # reading -----------------------------------------------------------------------------

    async def _read(
        self, conn: Connection, now: datetime, *, lock: bool = True
    ) -> tuple[dict[str, NodeDecision], list[Alert]]:
        if lock:
            await lock_cordon(conn, now)
        decisions = {
            node: NodeDecision.from_json(state)
            for node, state in (await cordon_states(conn)).items()
        }
        since = now - timedelta(seconds=self._policy.node_health.horizon)
        rows = await node_occurrences(conn, since)
        alerts = [
            Alert(r.fingerprint, AlertStatus.FIRING, r.labels, r.annotations, r.starts_at, None)
            for r in rows
        ]
        return decisions, alerts

    async def _incidents(self, conn: Connection, node: str) -> list[str]:
        """`level=element` of the open infrastructure incidents over the node's place."""
        if self._topology is None:
            return []
        place = self._topology.current().place(node)
        keys = [f"{level}={element}" for level, element in place.items()]
        states = await load_states(conn, "infra", keys)
        return [key for key, state in states.items() if state.get("open")]

    # the check ---------------------------------------------------------------------------

    async def run_once(self) -> list[str]:
        """Recommends (approve mode) or cordons (auto mode) the nodes over the threshold;
        returns them. An automatic cordon is reserved in the store (status cordoned) before
        the cluster is called, outside the transaction, and put back to a recommendation
        if the call fails."""
        if self.settings.cordon is Mode.OFF:
            return []
        now = self._clock()
        drafts: list[NotificationDraft] = []
        reserved: list[tuple[Candidate, str]] = []  # (candidate, the idempotency suffix)
        listed: dict[str, list[str]] = {}
        if self.settings.cordon is Mode.AUTO:  # the jobs' listed nodes, before the lock
            async with self._engine.connect() as conn:
                decisions, alerts = await self._read(conn, now, lock=False)
            found = self._nodes_only(
                candidates(alerts, self._policy, self.settings, decisions, now)
            )
            if not found:
                return []
            listed = await self._listed_nodes({job for c in found for job in c.jobs})
        async with self._engine.begin() as conn:
            decisions, alerts = await self._read(conn, now)
            found = self._nodes_only(
                candidates(alerts, self._policy, self.settings, decisions, now)
            )
            job_nodes = with_listed_nodes(job_nodes_of(alerts), listed)
            rows: dict[str, tuple[dict[str, Any], datetime | None]] = {}
            for candidate in found:
                node = candidate.health.node
                previous = decisions.get(node)
                key = previous.at.isoformat() if previous is not None else "first"
                reason = ""
                if self.settings.cordon is Mode.AUTO:
                    reason = blocked(
                        node, self.settings, decisions, job_nodes, now, automatic=True,
                        incident_elements=await self._incidents(conn, node),
                    ) or ""  # fmt: skip
                status = Status.RECOMMENDED
                if self.settings.cordon is Mode.AUTO and not reason:
                    status = Status.CORDONED
                    reserved.append((candidate, key))
                decision = self._decision(candidate, status, now, reason)
                decisions[node] = decision
                rows[node] = (decision.to_json(), None)
                if status is Status.RECOMMENDED:
                    drafts += self._drafts(candidate, decision, key)
            await save_states(conn, SCOPE, rows, now)
            written = await insert_notifications(conn, drafts, now)
        for candidate, key in reserved:
            written += await self._auto_cordon(candidate, key, now)
        if written and self._on_drafts is not None:
            self._on_drafts()
        if found:
            log.info(
                "cordon: nodes=%s mode=%s", [c.health.node for c in found], self.settings.cordon
            )
        return [c.health.node for c in found]

    def _nodes_only(self, found: list[Candidate]) -> list[Candidate]:
        """The candidates whose `node` label is a Kubernetes node name (a DNS-1123
        subdomain). Labels are anyone's and a node's name goes into an API path
        (`PATCH /api/v1/nodes/NAME`), so any other is skipped: no card, no request; logged
        once per label, with the reason."""
        kept = []
        for candidate in found:
            node = candidate.health.node
            if not (problems := subdomain_problems(node)):
                kept.append(candidate)
            elif node not in self._refused:
                if len(self._refused) >= MAX_REFUSED_LOGGED:
                    self._refused.clear()
                self._refused.add(node)
                log.warning(
                    "cordon: skipped node=%r: not a valid node name (%s)",
                    node[:253],
                    "; ".join(problems),
                )
        return kept

    def _decision(
        self, candidate: Candidate, status: Status, now: datetime, reason: str = ""
    ) -> NodeDecision:
        health = candidate.health
        by = "auto" if status is Status.CORDONED else ""
        return NodeDecision(status, now, by, health.score, health.faults, candidate.jobs, reason)

    async def _auto_cordon(self, candidate: Candidate, key: str, now: datetime) -> int:
        """The cluster calls of a reserved automatic cordon, then its card."""
        node = candidate.health.node
        reason = await self._cordon(node, "trainsentry (auto)", candidate.jobs)
        status = Status.RECOMMENDED if reason else Status.CORDONED
        decision = self._decision(candidate, status, now, reason)
        async with self._engine.begin() as conn:
            await lock_cordon(conn, now)
            if reason:  # not done: a human decides
                await save_states(conn, SCOPE, {node: (decision.to_json(), None)}, now)
            return await insert_notifications(conn, self._drafts(candidate, decision, key), now)

    def _drafts(
        self, candidate: Candidate, decision: NodeDecision, after: str
    ) -> list[NotificationDraft]:
        node = candidate.health.node
        text = summary(candidate)
        payload: dict[str, Any] = {
            "priority": PRIORITY.value,
            "status": "firing",
            "event": "cordon_" + decision.status.value,
            "alertname": "Cordon recommended",
            "annotations": {"summary": text},
            "at": decision.at.isoformat(),
            "cordon": {
                "node": node,
                "summary": text,
                "score": round(candidate.health.score, 3),
                "faults": dict(candidate.health.faults),
                "jobs": list(candidate.jobs),
                "status": decision.status.value,
                "reason": decision.reason,
            },
        }
        return [
            NotificationDraft(
                channel=channel,
                kind=KIND,
                priority=PRIORITY,
                idempotency_key=f"cordon:{channel}:{node}:{after}"[:300],
                payload=payload,
                group_key=f"cordon:{node}",
                reason=f"cordon {decision.status.value}: {node}",
            )
            for channel in self._channels
        ]

    # decisions ---------------------------------------------------------------------------

    async def decide(self, node: str, approve: bool, who: str) -> Outcome:
        """A press of Approve or Dismiss on the node's card. An approved cordon is reserved
        in the store first (guards checked under the lock), then the cluster is called
        outside the transaction; a failed call puts the recommendation back."""
        now = self._clock()
        listed: dict[str, list[str]] = {}
        if approve:  # the jobs' listed nodes, read before the lock
            async with self._engine.connect() as conn:
                stored = (await cordon_states(conn)).get(node)
            if stored is not None:
                listed = await self._listed_nodes(set(NodeDecision.from_json(stored).jobs))
        async with self._engine.begin() as conn:
            decisions, alerts = await self._read(conn, now)
            current = decisions.get(node)
            if current is None or current.status is not Status.RECOMMENDED:
                state = current.status.value if current is not None else "not recommended"
                return Outcome(False, f"{node}: {state}, nothing to decide")
            status = Status.CORDONED if approve else Status.DISMISSED
            if approve:
                job_nodes = with_listed_nodes(job_nodes_of(alerts), listed)
                reason = blocked(node, self.settings, decisions, job_nodes, now, automatic=False)
                if reason:
                    log.info("cordon: not done node=%s reason=%s", node, reason)
                    return Outcome(False, f"{node} not cordoned: {reason}")
            after = NodeDecision(status, now, who, current.score, current.faults, current.jobs)
            await save_states(conn, SCOPE, {node: (after.to_json(), None)}, now)
        if not approve:
            log.info("cordon: dismissed node=%s by=%s", node, who)
            return Outcome(True, f"{node}: dismissed", after)
        reason = await self._cordon(node, who, current.jobs)
        if reason:
            async with self._engine.begin() as conn:
                await lock_cordon(conn, now)
                await save_states(conn, SCOPE, {node: (current.to_json(), None)}, now)
            log.info("cordon: not done node=%s reason=%s", node, reason)
            return Outcome(False, f"{node} not cordoned: {reason}")
        log.info("cordon: cordoned node=%s by=%s", node, who)
        return Outcome(True, f"{node}: cordoned", after)

    async def uncordon(self, node: str, who: str) -> Outcome:
        """`trainsentry node uncordon NODE`: the Node schedulable again; the next
        recommendation counts only faults after now. Only a node trainsentry cordoned."""
        now = self._clock()
        async with self._engine.connect() as conn:
            before = NodeDecision.from_json(state) if (
                state := (await cordon_states(conn)).get(node)
            ) else None  # fmt: skip
        if before is None or before.status is not Status.CORDONED:
            return Outcome(False, f"{node} was not cordoned by trainsentry (kubectl uncordon)")
        try:
            kube = await self._kube()
            body = await self._patch_node(kube, node, None)
            if body is None:
                return Outcome(False, f"no node {node} in the cluster")
            await kube.create(EVENTS, "default", self._event(body, "Uncordoned", who))
        except Exception as exc:  # the API's answer, or it is unreachable
            return Outcome(False, f"{node} not uncordoned: {_api_problem(exc)}")
        await self._job_conditions(kube, before.jobs, False, f"node {node} uncordoned by {who}")
        after = NodeDecision(Status.UNCORDONED, now, who, before.score, before.faults, before.jobs)
        async with self._engine.begin() as conn:
            await lock_cordon(conn, now)
            await save_states(conn, SCOPE, {node: (after.to_json(), None)}, now)
        log.info("cordon: uncordoned node=%s by=%s", node, who)
        return Outcome(True, f"{node}: uncordoned", after)

    # the cluster -------------------------------------------------------------------------

    async def _listed_nodes(self, jobs: set[str]) -> dict[str, list[str]]:
        """job -> the nodes its TrainingJob lists in `status.nodes` (the operator writes
        them); a job that cannot be read is left out (its alert-named nodes count alone).
        Attacker-controlled: only short printable strings, at most MAX_LISTED per job."""
        found: dict[str, list[str]] = {}
        for job in sorted(jobs)[:MAX_JOBS_READ]:
            namespace, _, name = job.partition("/")
            if not (namespace and name):
                continue
            try:
                kube = await self._kube()
                body = await kube.get(TRAININGJOBS, namespace, name)
            except Exception as exc:
                log.warning("cordon: job not read job=%s error=%s", job, _api_problem(exc))
                continue
            nodes = ((body or {}).get("status") or {}).get("nodes") or []
            if isinstance(nodes, list):
                found[job] = [
                    n for n in nodes[:MAX_LISTED]
                    if isinstance(n, str) and 0 < len(n) <= 253 and n.isprintable()
                ]  # fmt: skip
        return found

    async def _cordon(self, node: str, who: str, jobs: tuple[str, ...]) -> str:
        """Cordons the node; "" when done, else why not (the API's answer)."""
        try:
            kube = await self._kube()
            body = await self._patch_node(kube, node, True)
            if body is None:
                return f"no node {node} in the cluster"
            await kube.create(EVENTS, "default", self._event(body, "Cordoned", who))
        except Exception as exc:  # the API's answer, or it is unreachable
            return _api_problem(exc)
        await self._job_conditions(kube, jobs, True, f"node {node} cordoned by {who}")
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
        self, kube: Kube, jobs: tuple[str, ...], cordoned: bool, message: str
    ) -> None:
        for job in jobs:
            namespace, _, name = job.partition("/")
            if not (namespace and name):
                continue
            try:
                await self._job_condition(kube, namespace, name, cordoned, message)
            except Exception as exc:  # the node stands as it is; the condition is a courtesy
                log.warning("cordon: condition not written job=%s error=%s", job, _api_problem(exc))

    async def _job_condition(
        self, kube: Kube, namespace: str, name: str, cordoned: bool, message: str
    ) -> None:
        await kube.rewrite_conditions(
            TRAININGJOBS,
            namespace,
            name,
            lambda conditions, _meta: with_node_condition(
                conditions, cordoned, message, self._now()
            ),
        )

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
