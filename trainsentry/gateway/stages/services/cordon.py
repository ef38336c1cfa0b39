"""Cordon with a human in the loop (I/O): recommends sick nodes, cordons the approved ones
through the Kubernetes API, uncordons on request. Decisions are pure
(gateway/policy/cordon.py, the cards gateway/policy/cordon_cards.py); the evidence is asked
of Prometheus (stages/services/evidence.py), the cluster calls are
stages/services/cordon_cluster.py; this module reads the store and writes it.

Invariants:
- a hardware fault counts only when Prometheus confirmed it fired (stages/services/evidence.py):
  an alert anyone posted to Alertmanager or to the webhook is no evidence;
- one recommendation per node until it is decided (approved, dismissed): every check and
  every decision runs in one store transaction under the cordon lock row (store/cordon.py),
  so replicas decide one after the other; the card's idempotency key names the nodes and
  the decisions they follow, so a repeated check writes nothing twice;
- the nodes of one check share a card per open infrastructure incident, and at most
  `remediation.max_cards_per_hour` cards go out in any hour (the card times are stored under
  the same lock); nodes without room are held, not recorded, and come in a later check;
- only `remediation.approvers` decide a recommendation: a press by anyone else changes
  nothing and is answered so;
- a cordon is done only when the guards allow it, checked under the lock with the jobs the
  cluster lists on the node (read before the transaction); it is reserved in the store
  (status cordoned) before the cluster is called, and the cluster is called outside any
  store transaction (SQLite's single writer is never held by it); a failed call puts the
  recommendation back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import Alert, NotificationDraft
from trainsentry.config.remediation import CordonSettings, Mode
from trainsentry.gateway.policy.cordon import (
    Candidate,
    NodeDecision,
    Status,
    blocked,
    candidates,
    counted_faults,
    jobs_on,
    share_nodes,
)
from trainsentry.gateway.policy.cordon_cards import drafts, entry, fold, recent_cards
from trainsentry.gateway.policy.evidence import key_of
from trainsentry.gateway.policy.route import CHANNEL_KINDS
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.stages.services.cordon_cluster import Cluster
from trainsentry.gateway.stages.services.evidence import Evidence
from trainsentry.gateway.stages.services.topology import TopologySource
from trainsentry.kube.names import subdomain_problems
from trainsentry.store.cordon import (
    SCOPE,
    card_times,
    cordon_states,
    lock_cordon,
    save_card_times,
)
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.node_health import node_occurrences
from trainsentry.store.policy_state import load_states, save_states
from trainsentry.store.writes import insert_notifications
from trainsentry.tasks import OwnedTask, every

log = logging.getLogger("trainsentry.cordon")

CARD_CHANNELS = frozenset({*CHANNEL_KINDS["feishu"], "console"})
MAX_REFUSED_LOGGED = 1_000  # refused node labels remembered, so each is logged once


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    message: str
    # the nodes of the pressed card as they now stand (node -> decision), to redraw it
    card: Mapping[str, NodeDecision] | None = None


@dataclass(slots=True)
class _Card:
    """One card of a check: its nodes' decisions and the decisions they follow."""

    incident: str
    decisions: dict[str, NodeDecision]
    after: list[str]


class Cordoner:
    def __init__(
        self,
        engine: Engine,
        settings: CordonSettings,
        policy: Policy,
        api_factory: Callable[[], Awaitable[Any]],
        channels: Collection[str],
        *,
        approvers: Mapping[str, str],
        topology: TopologySource | None = None,
        clock: Callable[[], datetime],
        on_drafts: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self._engine = engine
        self._policy = policy
        self._cluster = Cluster(api_factory, clock)
        self._evidence = Evidence(
            settings.evidence.prometheus_url,
            timeout_s=settings.evidence.timeout_seconds,
            clock=clock,
        )
        self._approvers = dict(approvers)  # feishu open_id -> name
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
        if self.settings.cordon is Mode.OFF:
            return
        if not self._evidence.url:
            log.warning(
                "event=cordon_no_evidence: remediation.evidence.prometheus_url is not set: no "
                "hardware alert can be confirmed, so no node is recommended or cordoned"
            )
        if not self._approvers:
            log.warning(
                "event=cordon_no_approvers: remediation.approvers is empty: nobody may approve "
                "or dismiss a recommendation (the cards say kubectl cordon instead)"
            )
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        await self._cluster.close()
        await self._evidence.aclose()

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
        return decisions, [row.alert() for row in rows]

    async def _incidents(self, conn: Connection, node: str) -> list[str]:
        """`level=element` of the open infrastructure incidents over the node's place, the
        most specific level first."""
        if self._topology is None:
            return []
        place = self._topology.current().place(node)
        keys = [f"{level}={element}" for level, element in place.items()]
        states = await load_states(conn, "infra", keys)
        return [key for key in keys if (states.get(key) or {}).get("open")]

    async def _confirmed(self, now: datetime) -> set[tuple[str, str]] | None:
        """The occurrences Prometheus confirmed among those that could make a candidate now
        (the sickest nodes' first), or None when they make no candidate."""
        async with self._engine.connect() as conn:
            decisions, alerts = await self._read(conn, now, lock=False)
        faults = counted_faults(alerts, self._policy, decisions, now)
        upper = self._nodes_only(candidates(faults, self._policy, self.settings, decisions, now))
        if not upper:
            return None
        rank = {c.health.node: i for i, c in enumerate(upper)}
        wanted = sorted(
            (a for a in faults if a.node in rank),
            key=lambda a: (rank[a.node], -a.starts_at.timestamp()),
        )
        confirmed = await self._evidence.confirmed(wanted)
        trusted = [a for a in wanted if key_of(a) in confirmed]
        if not candidates(trusted, self._policy, self.settings, decisions, now):
            return None
        return confirmed

    def _nodes_only(self, found: list[Candidate]) -> list[Candidate]:
        """The candidates whose `node` label is a Kubernetes node name (a DNS-1123
        subdomain). Labels are anyone's and a node's name goes into an API path
        (`PATCH /api/v1/nodes/NAME`), so any other is skipped: no card, no request; logged
        once per label, with the reason. (Never confirmed either: policy/evidence.py.)"""
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

    # the check ---------------------------------------------------------------------------

    async def run_once(self) -> list[str]:
        """Recommends (approve mode) or cordons (auto mode) the nodes over the threshold on
        confirmed evidence; returns them. An automatic cordon is reserved in the store
        (status cordoned) before the cluster is called, outside the transaction, and put
        back to a recommendation if the call fails."""
        if self.settings.cordon is Mode.OFF:
            return []
        now = self._clock()
        confirmed = await self._confirmed(now)
        if not confirmed:
            return []
        listed = await self._cluster.job_nodes()  # before the lock: the API may be slow
        auto = self.settings.cordon is Mode.AUTO
        cards: list[_Card] = []
        async with self._engine.begin() as conn:
            decisions, alerts = await self._read(conn, now)
            trusted = [a for a in alerts if key_of(a) in confirmed]
            found = [
                replace(c, jobs=jobs_on(c.health.node, listed or {}, c.jobs))
                for c in candidates(trusted, self._policy, self.settings, decisions, now)
            ]
            incidents = {c.health.node: await self._incidents(conn, c.health.node) for c in found}
            sent = recent_cards(await card_times(conn), now)
            room = self.settings.max_cards_per_hour - len(sent)
            folded = fold(found, {n: (i[0] if i else "") for n, i in incidents.items()}, room)
            for incident, members in folded:
                card = _Card(incident, {}, [])
                nodes = tuple(c.health.node for c in members)
                for candidate in members:
                    node = candidate.health.node
                    previous = decisions.get(node)
                    card.after.append(previous.at.isoformat() if previous else "first")
                    reason = ""
                    if auto:
                        jobs = None if listed is None else share_nodes(node, listed, candidate.jobs)
                        reason = blocked(
                            node, self.settings, decisions, jobs, now, automatic=True,
                            incident_elements=incidents[node],
                        ) or ""  # fmt: skip
                    status = Status.CORDONED if auto and not reason else Status.RECOMMENDED
                    decisions[node] = card.decisions[node] = self._decision(
                        candidate, status, now, reason, nodes
                    )
                cards.append(card)
            rows = {n: (d.to_json(), None) for c in cards for n, d in c.decisions.items()}
            written = 0
            if cards:
                await save_states(conn, SCOPE, rows, now)
                await save_card_times(conn, [*sent, *(now for _ in cards)], now)
                if not auto:
                    written = await insert_notifications(conn, self._drafts(cards, now), now)
        if auto and cards:
            written = await self._auto_cordon(cards, now)
        if written and self._on_drafts is not None:
            self._on_drafts()
        held = len(found) - sum(len(c.decisions) for c in cards)
        if found:
            log.info(
                "cordon: nodes=%s mode=%s cards=%d held=%d",
                [n for c in cards for n in c.decisions], self.settings.cordon, len(cards), held,
            )  # fmt: skip
        return [n for c in cards for n in c.decisions]

    def _decision(
        self,
        candidate: Candidate,
        status: Status,
        now: datetime,
        reason: str,
        card: tuple[str, ...],
    ) -> NodeDecision:
        health = candidate.health
        by = "auto" if status is Status.CORDONED else ""
        return NodeDecision(
            status, now, by, health.score, health.faults, candidate.jobs, reason, card
        )

    async def _auto_cordon(self, cards: list[_Card], now: datetime) -> int:
        """The cluster calls of the reserved automatic cordons, then the cards."""
        failed: dict[str, tuple[dict[str, Any], None]] = {}
        for card in cards:
            for node, decision in list(card.decisions.items()):
                if decision.status is not Status.CORDONED:
                    continue
                reason = await self._cluster.cordon(node, "trainsentry (auto)", decision.jobs)
                if reason:  # not done: a human decides
                    back = replace(decision, status=Status.RECOMMENDED, by="", reason=reason)
                    card.decisions[node] = back
                    failed[node] = (back.to_json(), None)
        async with self._engine.begin() as conn:
            await lock_cordon(conn, now)
            if failed:
                await save_states(conn, SCOPE, failed, now)
            return await insert_notifications(conn, self._drafts(cards, now), now)

    def _drafts(self, cards: list[_Card], now: datetime) -> list[NotificationDraft]:
        return [
            draft
            for card in cards
            for draft in drafts(
                self._channels,
                [entry(node, decision) for node, decision in card.decisions.items()],
                card.after,
                card.incident,
                self.settings,
                now,
            )
        ]

    # decisions ---------------------------------------------------------------------------

    def approver(self, who: str) -> str | None:
        """The approver's name for a Feishu open_id, or None: not one of them."""
        return self._approvers.get(who)

    def approver_id(self, name: str) -> str | None:
        """The Feishu open_id the approver named `name` presses as, or None: no approver
        has that name (the console acts by the signed-in name, then through `decide`)."""
        return next((key for key, known in self._approvers.items() if known == name), None)

    async def decide(self, node: str, approve: bool, who: str) -> Outcome:
        """A press of Approve or Dismiss on the node's card by `who` (the presser's Feishu
        open_id). Only an approver decides. An approved cordon is reserved in the store first
        (guards checked under the lock), then the cluster is called outside the transaction;
        a failed call puts the recommendation back."""
        name = self.approver(who)
        if name is None:
            log.info("cordon: refused node=%s presser=%s: not an approver", node, who[:64])
            return Outcome(False, f"{who[:64]} may not decide cordons (remediation.approvers)")
        now = self._clock()
        listed: dict[str, list[str]] | None = {}
        if approve:  # the jobs on the node, read before the lock
            listed = await self._cluster.job_nodes()
        async with self._engine.begin() as conn:
            decisions, _alerts = await self._read(conn, now)
            current = decisions.get(node)
            if current is None or current.status is not Status.RECOMMENDED:
                state = current.status.value if current is not None else "not recommended"
                return Outcome(False, f"{node}: {state}, nothing to decide")
            status = Status.CORDONED if approve else Status.DISMISSED
            if approve:
                jobs = None if listed is None else share_nodes(node, listed, current.jobs)
                reason = blocked(node, self.settings, decisions, jobs, now, automatic=False)
                if reason:
                    log.info("cordon: not done node=%s reason=%s", node, reason)
                    return Outcome(False, f"{node} not cordoned: {reason}")
            after = replace(current, status=status, at=now, by=name, reason="")
            await save_states(conn, SCOPE, {node: (after.to_json(), None)}, now)
            decisions[node] = after
        if not approve:
            log.info("cordon: dismissed node=%s by=%s", node, name)
            return Outcome(True, f"{node}: dismissed", await self._card_of(node, decisions))
        reason = await self._cluster.cordon(node, name, current.jobs)
        if reason:
            async with self._engine.begin() as conn:
                await lock_cordon(conn, now)
                await save_states(conn, SCOPE, {node: (current.to_json(), None)}, now)
            log.info("cordon: not done node=%s reason=%s", node, reason)
            return Outcome(False, f"{node} not cordoned: {reason}")
        log.info("cordon: cordoned node=%s by=%s", node, name)
        return Outcome(True, f"{node}: cordoned", await self._card_of(node, decisions))

    async def _card_of(
        self, node: str, decisions: Mapping[str, NodeDecision]
    ) -> dict[str, NodeDecision]:
        """The nodes of `node`'s card as they now stand (a replica may have decided one)."""
        nodes = decisions[node].card or (node,)
        async with self._engine.connect() as conn:
            stored = await load_states(conn, SCOPE, nodes)
        found = {n: NodeDecision.from_json(stored[n]) for n in nodes if n in stored}
        found[node] = decisions[node]
        return {n: found[n] for n in nodes if n in found}

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
        reason = await self._cluster.uncordon(node, who, before.jobs)
        if reason:
            prefix = "" if reason.startswith("no node") else f"{node} not uncordoned: "
            return Outcome(False, prefix + reason)
        after = replace(before, status=Status.UNCORDONED, at=now, by=who)
        async with self._engine.begin() as conn:
            await lock_cordon(conn, now)
            await save_states(conn, SCOPE, {node: (after.to_json(), None)}, now)
        log.info("cordon: uncordoned node=%s by=%s", node, who)
        return Outcome(True, f"{node}: uncordoned", {node: after})
