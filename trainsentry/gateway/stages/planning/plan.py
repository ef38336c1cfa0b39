"""The alert policy wired to the store: the PlanHook the planning worker calls inside its
transaction (the ticker that fires the policy's timers is ticker.py).

The decisions themselves are pure (`decide.fold_into`, `decide.flush`, `decide.decide_tick`);
this module only loads their states, counts the blast radius, writes states and priorities,
and hands the drafts to the policy's steps (steps.py: mute, page, hold, write).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import (
    Alert,
    AlertChange,
    AlertStatus,
    ChangeKind,
    JobRef,
    NotificationDraft,
)
from trainsentry.gateway.metrics import PolicyMetrics
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.decide import ChangeResult, decide_tick, flush, fold_into
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.incident import IncidentBook
from trainsentry.gateway.policy.infra import (
    InfraFold,
    InfraState,
    Sighting,
    infrastructure_component,
    sightings,
)
from trainsentry.gateway.policy.infra_hold import held_elements
from trainsentry.gateway.policy.payload_build import ALERT_KIND, alert_to_json, idempotency_key
from trainsentry.gateway.policy.route import ARCHIVE_CHANNELS, JobRoute, unconfigured_names
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import StormState, job_key
from trainsentry.gateway.policy.storm_fold import StormFold
from trainsentry.gateway.policy.topology import Topology, members, place_of
from trainsentry.gateway.stages.planning.incidents import IncidentLedger, resolved_pages
from trainsentry.gateway.stages.planning.steps import (
    BatchContext,
    Delivery,
    PlanStep,
    Prepared,
    Write,
    deliver,
    deliver_due,
    prepare,
)
from trainsentry.maintenance.match import active_span, muted_by
from trainsentry.maintenance.types import MaintenanceWindow
from trainsentry.store.engine import Connection
from trainsentry.store.infra import recent_on_nodes, set_places
from trainsentry.store.policy_state import (
    claim_due,
    distinct_nodes,
    load_states,
    save_states,
    window_start,
)
from trainsentry.store.queries import set_priorities

log = logging.getLogger("trainsentry.policy")

FINGERPRINT_SCOPE = "fingerprint"
STORM_SCOPE = "storm"
INFRA_SCOPE = "infra"


def _fp_row(state: FingerprintState) -> tuple[dict[str, Any], datetime | None]:
    return state.to_json(), state.hold_until


def _storm_row(state: StormState, policy: Policy) -> tuple[dict[str, Any], datetime | None]:
    return state.to_json(), state.next_due(policy)


def archive_draft(
    channel: str, change: AlertChange, classification: Classification
) -> NotificationDraft:
    """The archive row notification for one state change of an occurrence."""
    alert = change.alert
    # the alert as stored: its status is already resolved for resolved and expired changes
    payload: dict[str, Any] = {
        **alert_to_json(alert),
        "event": change.kind.value,
        "alertname": alert.name,
        "priority": classification.priority.value,
        "reason": classification.reason,
        "rule_id": classification.rule_id,
        "expired": change.kind is ChangeKind.EXPIRED,
        "at": change.at.isoformat(),
        "alert_id": change.alert_id,
    }
    if alert.job is not None:
        payload["job"] = str(alert.job)
    return NotificationDraft(
        channel=channel,
        kind=ALERT_KIND,
        priority=classification.priority,
        idempotency_key=idempotency_key(
            "archive", channel, str(change.alert_id), change.kind.value, change.at.isoformat()
        ),
        payload=payload,
        alert_id=change.alert_id,
        group_key=f"occurrence:{change.alert_id}",  # the resolve update follows the append
        reason=f"{classification.rule_id}: {classification.reason}",
    )


def _stretches(
    windows: Sequence[MaintenanceWindow],
    changes: Sequence[AlertChange],
    places: Mapping[int, Mapping[str, str]],
    now: datetime,
) -> dict[int, str]:
    """Pure: the alerts a window mutes now (its matchers see the alert's place in the
    topology under its labels, as the mute does), with the stretch muting each."""
    found: dict[int, str] = {}
    for change in changes if windows else ():
        labels = {**places.get(change.alert_id, {}), **change.alert.labels}
        window = muted_by(windows, labels, now)
        span = active_span(window, now) if window is not None else None
        if window is not None and span is not None:
            found[change.alert_id] = f"{window.id}@{span[0].isoformat()}"
    return found


@dataclass
class _Batch:
    """One batch's states inside the planning transaction: loaded before its changes are
    decided, changed by them in order, saved at its end; its drafts and the priorities of
    its firing changes, gathered as they are decided."""

    fp_states: dict[str, FingerprintState]  # by fingerprint
    storm_states: dict[str, StormState]  # by job key
    # (job namespace, job name, alertname) -> distinct nodes within the blast-radius window
    blast: dict[tuple[str, str, str], int]
    places: dict[int, dict[str, str]]  # alert id -> its place in the topology
    # alert id -> the window stretch muting it ("<window id>@<its start>")
    in_maintenance: dict[int, str]
    infra_states: dict[str, InfraState] = field(default_factory=dict)
    seen: dict[str, Sighting] = field(default_factory=dict)
    drafts: list[NotificationDraft] = field(default_factory=list)
    priorities: list[tuple[int, str, str]] = field(default_factory=list)


class PolicyPlan:
    """Changes in, states + priorities + outbox rows written, in the caller's transaction.

    Built whole: its steps around the pure decisions (steps.py `plan_steps`: mute, page,
    hold, write) are handed in, and never change; a batch and a tick run the same steps.
    Each batch (and tick) is decided against one `BatchContext`, made once at its start."""

    def __init__(
        self,
        policy: Policy,
        channels: Collection[str],
        *,
        steps: Sequence[PlanStep] = (Write(),),
        metrics: PolicyMetrics | None = None,
        topology: Callable[[], Topology] | None = None,
        job_routes: Callable[[], Mapping[JobRef, JobRoute]] | None = None,
        updatable: Collection[str] = (),
    ) -> None:
        """`topology`: where each node stands (gateway/stages/services/topology.py), None when none
        is configured. `job_routes`: TrainingJobs' own routes as last read from the cluster
        (stages/services/job_alerting.py), asked once per batch. `updatable`: channels that redraw a
        card in place (the Feishu app): an incident's changes update its card there; the
        others get new cards only as incident_cards.py says. Raises ValueError when the
        last step is not the write."""
        if not steps or not isinstance(steps[-1], Write):
            raise ValueError("a policy's steps end with the outbox write (steps.plan_steps)")
        self.policy = policy
        self.steps = tuple(steps)
        self.updatable = frozenset(updatable)
        self.incidents = IncidentLedger(policy)
        self.topology = topology
        self._members: tuple[Topology, dict[str, tuple[str, ...]]] | None = None
        self.job_routes = job_routes
        # Archive channels get every occurrence (one row, updated on resolve), whatever dedup
        # and storm collapse decide for the chat and phone channels.
        self.archive_channels = frozenset(channels) & ARCHIVE_CHANNELS
        self.channels = frozenset(channels) - self.archive_channels
        if missing := unconfigured_names(policy, channels):
            log.warning(
                "the policy routes to channels this gateway does not have, dropped: %s "
                "(configure them, or change policy.routing)",
                ", ".join(missing),
            )
        self.metrics = metrics
        # alert id -> classified priority of the last batch (read after its commit)
        self.classified: dict[int, str] = {}

    def context(self, now: datetime) -> BatchContext:
        """The batch's context: the job routes read once, now."""
        return BatchContext(
            policy=self.policy,
            channels=self.channels,
            archive_channels=self.archive_channels,
            updatable=self.updatable,
            job_routes=self.job_routes() if self.job_routes is not None else None,
            now=now,
        )

    async def __call__(
        self, conn: Connection, changes: Sequence[AlertChange], now: datetime
    ) -> int:
        """Plans a batch in the caller's transaction: what the steps must know first, its
        states loaded, its changes decided in order, its incidents drafted once, the states
        saved, the drafts through the steps to the outbox; returns the outbox rows written."""
        ctx = self.context(now)
        found = await prepare(conn, self.steps, changes, ctx)
        batch = await self._load_batch(conn, changes, ctx, found)
        self.classified = {}
        # The batch's incidents: changed by each change, drafted once at the end (`flush`).
        prior = [fp.alert_id for fp in batch.fp_states.values() if fp.alert_id is not None]
        book = await self.incidents.book(conn, changes, batch.in_maintenance, prior)
        book.diagnosed, book.unsent = found.held, found.unsent
        await self._infra_of_incidents(conn, batch, book)
        self._fold(batch, changes, book, ctx)
        infra_open = await self._open_elements(conn, book, batch.infra_states)
        self._flush_incidents(batch, book, ctx, infra_open)
        ended_pages = tuple(resolved_pages(book))
        await self.incidents.save(conn, book, now)
        await self._save_batch(conn, batch, now)
        written = await deliver(conn, self.steps, batch.drafts, Delivery(ctx, found, ended_pages))
        return len(written)

    async def _load_batch(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        ctx: BatchContext,
        prepared: Prepared,
    ) -> _Batch:
        """What the batch's decisions read: the stored dedup and storm states, the blast
        radius, the alerts' places, the maintenance stretches muting them now (`prepared`'s
        windows), and the infrastructure incidents and sightings around their hardware
        alerts."""
        now = ctx.now
        fingerprints = {change.alert.fingerprint for change in changes}
        jobs = {job_key(change.alert.labels) for change in changes}
        fp_states = {
            key: FingerprintState.from_json(data)
            for key, data in (await load_states(conn, FINGERPRINT_SCOPE, fingerprints)).items()
        }
        storm_states = {
            key: StormState.from_json(data)
            for key, data in (await load_states(conn, STORM_SCOPE, jobs)).items()
        }
        blast = await self._blast_radius(conn, changes, now)
        topology = self.topology() if self.topology is not None else None
        places = {
            c.alert_id: found
            for c in changes
            if topology is not None and (found := place_of(topology, c.alert))
        }
        # A node under maintenance is no evidence of a broken switch: its alerts are muted
        # by their window as usual, never folded into (nor counted for) an incident; and
        # they never share an incident (a card) with alerts that notify.
        windows = prepared.windows
        batch = _Batch(
            fp_states, storm_states, blast, places, _stretches(windows, changes, places, now)
        )
        hardware = [
            c
            for c in changes
            if c.alert_id in places
            and c.alert_id not in batch.in_maintenance
            and infrastructure_component(c.alert, self.policy)
        ]
        if topology is not None and self.policy.infrastructure.enabled:
            batch.infra_states, batch.seen = await self._infra_context(
                conn, topology, places, hardware, windows, now
            )
        return batch

    async def _blast_radius(
        self, conn: Connection, changes: Sequence[AlertChange], now: datetime
    ) -> dict[tuple[str, str, str], int]:
        """For each firing (job namespace, job name, alertname) of the batch: the distinct
        nodes it fired on within the policy's blast-radius window."""
        return await distinct_nodes(
            conn,
            [
                (
                    c.alert.job.namespace if c.alert.job else "",
                    c.alert.job.name if c.alert.job else "",
                    c.alert.name,
                )
                for c in changes
                if c.kind is ChangeKind.FIRING
            ],
            window_start(now, self.policy.blast_radius.window),
        )

    def _fold(
        self,
        batch: _Batch,
        changes: Sequence[AlertChange],
        book: IncidentBook,
        ctx: BatchContext,
    ) -> None:
        """Decides each change in order (`decide.fold_into`: dedup, storm, infrastructure
        incident; the incident cards wait for `_flush_incidents`), recorded into `batch`.
        Each job's storm state is changed in place by the batch's changes and frozen once at
        its end: during a storm, no state copy per alert."""
        folds: dict[str, StormFold] = {}
        for change in changes:
            alert = change.alert
            job = alert.job
            key = job_key(alert.labels)
            if (fold := folds.get(key)) is None:
                stored = batch.storm_states.get(key)
                fold = folds[key] = StormFold.of(stored or StormState.new(alert.labels))
            place = batch.places.get(change.alert_id)
            # Without a place an alert can still be a consequence of an incident's failure
            # (a job's RAS errors, its hang: infra.py `fold_consequence`).
            infra = (
                InfraFold(self.policy, place or {}, batch.infra_states, batch.seen, alert.labels)
                if self.topology is not None
                and self.policy.infrastructure.enabled
                and change.alert_id not in batch.in_maintenance
                else None
            )
            result = fold_into(
                fold,
                change,
                fingerprint_state=batch.fp_states.get(alert.fingerprint),
                distinct_nodes_in_window=batch.blast.get(
                    (job.namespace if job else "", job.name if job else "", alert.name), 1
                ),
                policy=ctx.policy,
                now=ctx.now,
                channels=ctx.channels,
                job_routes=ctx.job_routes,
                place=place,
                infra=infra,
                incidents=book,
                updatable=ctx.updatable,
            )
            self._record(batch, change, result)
        batch.storm_states.update((key, fold.freeze()) for key, fold in folds.items())

    def _record(self, batch: _Batch, change: AlertChange, result: ChangeResult) -> None:
        """One change's decision into the batch: its states, its drafts and one archive row
        per archive channel, its metrics, and a firing change's priority."""
        batch.infra_states.update(result.infra_states)
        batch.fp_states[change.alert.fingerprint] = result.fingerprint_state
        batch.drafts.extend(result.drafts)
        for channel in sorted(self.archive_channels):
            batch.drafts.append(archive_draft(channel, change, result.classification))
        if self.metrics is not None:
            self.metrics.observe(result)
        if change.kind is ChangeKind.FIRING:
            c = result.classification
            batch.priorities.append((change.alert_id, c.priority.value, c.reason))
            self.classified[change.alert_id] = c.priority.value

    def _flush_incidents(
        self, batch: _Batch, book: IncidentBook, ctx: BatchContext, infra_open: frozenset[str]
    ) -> None:
        """The drafts of the incidents the batch changed, once each, after its changes."""
        incident_drafts, unconfigured = flush(
            book,
            policy=ctx.policy,
            now=ctx.now,
            channels=ctx.channels,
            job_routes=ctx.job_routes,
            updatable=ctx.updatable,
            infra_open=infra_open,
        )
        batch.drafts.extend(incident_drafts)
        if self.metrics is not None:
            self.metrics.observe_drafts(incident_drafts, unconfigured)
        for draft in batch.drafts:  # an archive row names its incident's priority too
            if draft.channel in self.archive_channels and draft.alert_id is not None:
                found = book.members.get(draft.alert_id)
                state = book.by_id.get(found) if found is not None else None
                if state is not None:
                    draft.payload["incident_priority"] = state.priority.value

    async def _save_batch(self, conn: Connection, batch: _Batch, now: datetime) -> None:
        """The batch's dedup, storm and infrastructure states, its alerts' priorities and
        places, written in the caller's transaction."""
        await save_states(
            conn, FINGERPRINT_SCOPE, {k: _fp_row(v) for k, v in batch.fp_states.items()}, now
        )
        await save_states(
            conn,
            STORM_SCOPE,
            {k: _storm_row(v, self.policy) for k, v in batch.storm_states.items()},
            now,
        )
        await set_priorities(conn, batch.priorities)
        await set_places(conn, sorted(batch.places.items()))
        await save_states(
            conn, INFRA_SCOPE, {k: (v.to_json(), None) for k, v in batch.infra_states.items()}, now
        )

    async def _infra_of_incidents(
        self, conn: Connection, batch: _Batch, book: IncidentBook
    ) -> None:
        """The stored infrastructure incidents that the batch's incidents were folded into
        (`IncidentState.infra`) and the batch did not load by place: a consequence without a
        node (a job's RAS errors, its hang) joins such an incident and is folded there."""
        if self.topology is None or not self.policy.infrastructure.enabled:
            return
        keys = {s.infra for s in book.by_id.values() if s.infra} - batch.infra_states.keys()
        if keys:
            batch.infra_states.update(
                (key, InfraState.from_json(data))
                for key, data in (await load_states(conn, INFRA_SCOPE, keys)).items()
            )

    async def _open_elements(
        self, conn: Connection, book: IncidentBook, known: Mapping[str, InfraState]
    ) -> frozenset[str]:
        """Of the elements the book's held incidents wait for (infra_hold.py), those whose
        infrastructure incident is open: as `known` has it (the batch's, after its changes),
        else as stored."""
        if self.topology is None or not self.policy.infrastructure.enabled:
            return frozenset()
        wanted = held_elements(book.by_id.values())
        states = {key: known[key] for key in wanted if key in known}
        if missing := wanted - states.keys():
            stored = await load_states(conn, INFRA_SCOPE, missing)
            states.update((key, InfraState.from_json(data)) for key, data in stored.items())
        return frozenset(key for key, state in states.items() if state.open)

    async def _infra_context(
        self,
        conn: Connection,
        topology: Topology,
        places: Mapping[int, Mapping[str, str]],
        hardware: Sequence[AlertChange],
        windows: Sequence[MaintenanceWindow],
        now: datetime,
    ) -> tuple[dict[str, InfraState], dict[str, Sighting]]:
        """The stored incidents of the elements of the batch's `places` (alert id -> place),
        and the hardware alerts the store holds within the window under the elements of the
        batch's `hardware` alerts (each placed) that have no open incident (this batch's
        included: the intake stored it). Nothing is read when the batch holds no hardware
        alert, nor once every element it touches is open (a storm under an open incident
        costs one state read per batch): under an open one the batch's own firing alerts are
        its sighting, so a card or page drafted at its first alert counts the whole batch
        (its last pieces are in the state only once folded)."""
        keys = {f"{lv}={el}" for place in places.values() for lv, el in place.items()}
        if not keys:
            return {}, {}
        states = {
            key: InfraState.from_json(data)
            for key, data in (await load_states(conn, INFRA_SCOPE, keys)).items()
        }
        counted: set[str] = set()
        firing = [c.alert for c in hardware if c.kind is ChangeKind.FIRING]
        own = sightings(firing, topology, self.policy) if firing else {}
        for place in (places[c.alert_id] for c in hardware):  # placed, as `_load_batch` found
            place_keys = [f"{level}={element}" for level, element in place.items()]
            if not any((state := states.get(key)) is not None and state.open for key in place_keys):
                counted.update(place_keys)  # an open incident would take the alert first
        seen = {key: found for key, found in own.items() if key not in counted}
        if not counted:
            return states, seen
        if self._members is None or self._members[0] is not topology:
            self._members = (topology, members(topology))
        index = self._members[1]
        nodes = {node for key in counted for node in index.get(key, ())}
        since = window_start(now, self.policy.infrastructure.window)
        recent = [
            Alert(
                fingerprint=f"stored:{row.alert_id}",
                status=AlertStatus.FIRING,
                labels=row.labels,
                annotations=row.annotations,
                starts_at=row.starts_at,
                ends_at=None,
                resolved_node=row.node,
            )
            for row in await recent_on_nodes(conn, nodes, since)
            if not muted_by(windows, row.labels, now)
        ]
        return states, {**seen, **sightings(recent, topology, self.policy)}

    async def tick(self, conn: Connection, now: datetime) -> int:
        """Fires due timers (the steps' own: escalation calls, windows that ended; then the
        policy's: held resolutions, storm summaries, calm storms), through the same steps as
        a batch; returns the outbox rows written."""
        ctx = self.context(now)
        written = len(await deliver_due(conn, self.steps, ctx))
        due_fps = await claim_due(conn, FINGERPRINT_SCOPE, now)
        due_storms = await claim_due(conn, STORM_SCOPE, now)
        fp_states = [FingerprintState.from_json(data) for data in due_fps.values()]
        held = [fp.alert_id for fp in fp_states if fp.alert_id is not None]
        book = await self.incidents.book_for_tick(conn, held, now)
        if not due_fps and not due_storms and not book.changed:
            return written
        # A released resolution may touch a storm that is not itself due: load those too.
        extra_jobs = {
            job_key(dict(fp.context.get("alert", {}).get("labels", {}))) for fp in fp_states
        } - set(due_storms)
        storms = {**due_storms, **(await load_states(conn, STORM_SCOPE, extra_jobs))}
        result = decide_tick(
            fp_states,
            [StormState.from_json(data) for data in storms.values()],
            policy=ctx.policy,
            now=now,
            channels=ctx.channels,
            job_routes=ctx.job_routes,
            incidents=book,
            updatable=ctx.updatable,
            infra_open=await self._open_elements(conn, book, {}),
        )
        if self.metrics is not None:
            self.metrics.observe(result)
        ended_pages = tuple(resolved_pages(book))
        await self.incidents.save(conn, book, now)
        fp_rows = {k: _fp_row(v) for k, v in result.fingerprint_states.items()}
        # States that were due but did not change must not stay due forever.
        for fp in fp_states:
            if fp.fingerprint not in fp_rows and fp.hold_until is not None and fp.hold_until <= now:
                fp_rows[fp.fingerprint] = (fp.to_json(), None)
        storm_rows = {k: _storm_row(v, self.policy) for k, v in result.storm_states.items()}
        for key, data in due_storms.items():
            if key not in storm_rows:
                state = StormState.from_json(data)
                due_at = state.next_due(self.policy)
                storm_rows[key] = (data, due_at if due_at is not None and due_at > now else None)
        await save_states(conn, FINGERPRINT_SCOPE, fp_rows, now)
        await save_states(conn, STORM_SCOPE, storm_rows, now)
        delivery = Delivery(ctx, Prepared(), ended_pages)
        written += len(await deliver(conn, self.steps, list(result.drafts), delivery))
        return written
