"""The alert policy wired to the store: the PlanHook the planning worker calls inside its
transaction (the ticker that fires the policy's timers is ticker.py).

The decisions themselves are pure (`decide.decide`, `decide.decide_tick`); this module only
loads their states, counts the blast radius, and writes states, priorities and outbox rows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

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
    hardware_component,
    sightings,
)
from trainsentry.gateway.policy.payload_build import ALERT_KIND, alert_to_json, idempotency_key
from trainsentry.gateway.policy.route import ARCHIVE_CHANNELS, JobRoute, unconfigured_names
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import StormState, job_key
from trainsentry.gateway.policy.storm_fold import StormFold
from trainsentry.gateway.policy.topology import Topology, members
from trainsentry.gateway.stages.paging import Paging
from trainsentry.gateway.stages.planning.incidents import IncidentLedger, resolved_pages
from trainsentry.oncall.types import MaintenanceWindow
from trainsentry.oncall.window_match import active_span, muted_by
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
from trainsentry.store.writes import insert_notifications

# The hang diagnosis' hook, inside the planning transaction: holds or cancels the drafts of
# hang alerts (stages/diagnosis.py, HangDiagnoser.hold).
HoldHook = Callable[
    [Connection, Sequence[AlertChange], Sequence[NotificationDraft], datetime], Awaitable[None]
]


class MaintenanceHook(Protocol):
    """Maintenance windows inside the planning transaction (stages/maintenance_service.py)."""

    async def mute(
        self,
        conn: Connection,
        drafts: list[NotificationDraft],
        now: datetime,
        spare_channels: Collection[str] = (),
    ) -> list[NotificationDraft]: ...

    async def tick(self, conn: Connection, now: datetime) -> list[NotificationDraft]: ...

    async def windows_now(self, conn: Connection, now: datetime) -> list[MaintenanceWindow]: ...


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
    """Changes in, states + priorities + outbox rows written, in the caller's transaction."""

    def __init__(
        self,
        policy: Policy,
        channels: Collection[str],
        *,
        metrics: PolicyMetrics | None = None,
        paging: Paging | None = None,
        topology: Callable[[], Topology] | None = None,
        updatable: Collection[str] = (),
    ) -> None:
        self.policy = policy
        # Channels that redraw a card in place (the Feishu app): an incident's changes
        # update its card there; the others get new cards only as incident_cards.py says.
        self.updatable = frozenset(updatable)
        self.incidents = IncidentLedger(policy)
        # Where each node stands (gateway/stages/topology.py); None: no topology configured.
        self.topology = topology
        self._members: tuple[Topology, dict[str, tuple[str, ...]]] | None = None
        self.paging = paging
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
        self.drafted = 0
        # alert id -> classified priority of the last batch (read after its commit)
        self.classified: dict[int, str] = {}
        # Set by the app when hang diagnosis is on: holds drafts of alerts being diagnosed.
        self.hold: HoldHook | None = None
        # Set by the app: maintenance windows mute chat and phone drafts, archives excepted.
        self.maintenance: MaintenanceHook | None = None
        # Set by the app when TrainingJobs route their own alerts (stages/job_alerting.py):
        # the routes as last read from the cluster, asked once per batch.
        self.job_routes: Callable[[], Mapping[JobRef, JobRoute]] | None = None

    async def __call__(
        self, conn: Connection, changes: Sequence[AlertChange], now: datetime
    ) -> int:
        """Plans a batch in the caller's transaction: loads its states, decides its changes
        in order, drafts its incidents once, saves the states, delivers the drafts to the
        outbox; returns the outbox rows written."""
        batch = await self._load_batch(conn, changes, now)
        self.classified = {}
        job_routes = self.job_routes() if self.job_routes is not None else None
        # The batch's incidents: changed by each change, drafted once at the end (`flush`).
        prior = [fp.alert_id for fp in batch.fp_states.values() if fp.alert_id is not None]
        book = await self.incidents.book(conn, changes, batch.in_maintenance, prior)
        self._fold(batch, changes, book, job_routes, now)
        self._flush_incidents(batch, book, job_routes, now)
        ended_pages = resolved_pages(book)
        await self.incidents.save(conn, book, now)
        await self._save_batch(conn, batch, now)
        return await self._deliver(conn, changes, batch.drafts, ended_pages, now)

    async def _load_batch(
        self, conn: Connection, changes: Sequence[AlertChange], now: datetime
    ) -> _Batch:
        """What the batch's decisions read: the stored dedup and storm states, the blast
        radius, the alerts' places, the maintenance stretches muting them now, and the
        infrastructure incidents and sightings around their hardware alerts."""
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
            if topology is not None and (found := topology.place(c.alert.node))
        }
        # A node under maintenance is no evidence of a broken switch: its alerts are muted
        # by their window as usual, never folded into (nor counted for) an incident; and
        # they never share an incident (a card) with alerts that notify.
        windows: list[MaintenanceWindow] = []
        if self.maintenance is not None:
            windows = await self.maintenance.windows_now(conn, now)
        batch = _Batch(
            fp_states, storm_states, blast, places, _stretches(windows, changes, places, now)
        )
        hardware_places = [
            places[c.alert_id]
            for c in changes
            if c.alert_id in places
            and c.alert_id not in batch.in_maintenance
            and hardware_component(c.alert, self.policy)
        ]
        if topology is not None and self.policy.infrastructure.enabled:
            batch.infra_states, batch.seen = await self._infra_context(
                conn, topology, places.values(), hardware_places, windows, now
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
        job_routes: Mapping[JobRef, JobRoute] | None,
        now: datetime,
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
            infra = (
                InfraFold(self.policy, place, batch.infra_states, batch.seen, alert.labels)
                if place
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
                policy=self.policy,
                now=now,
                channels=self.channels,
                job_routes=job_routes,
                place=place,
                infra=infra,
                incidents=book,
                updatable=self.updatable,
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
            batch.priorities.append((change.alert_id, c.priority.value, f"{c.rule_id}: {c.reason}"))
            self.classified[change.alert_id] = c.priority.value

    def _flush_incidents(
        self,
        batch: _Batch,
        book: IncidentBook,
        job_routes: Mapping[JobRef, JobRoute] | None,
        now: datetime,
    ) -> None:
        """The drafts of the incidents the batch changed, once each, after its changes."""
        incident_drafts, unconfigured = flush(
            book,
            policy=self.policy,
            now=now,
            channels=self.channels,
            job_routes=job_routes,
            updatable=self.updatable,
        )
        batch.drafts.extend(incident_drafts)
        if self.metrics is not None:
            self.metrics.observe_drafts(incident_drafts, unconfigured)

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

    async def _deliver(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        drafts: list[NotificationDraft],
        ended_pages: list[int],
        now: datetime,
    ) -> int:
        """The drafts muted by maintenance windows (archives spared), pages turned into
        escalations, hang alerts' drafts held for the diagnosis, then written to the outbox;
        returns the rows written."""
        if self.maintenance is not None:
            drafts = await self.maintenance.mute(conn, drafts, now, self.archive_channels)
        if self.paging is not None:
            drafts = await self._escalate(conn, drafts, ended_pages, now)
        if self.hold is not None:
            await self.hold(conn, changes, drafts, now)
        written = await insert_notifications(conn, drafts, now)
        self.drafted += written
        return written

    async def _infra_context(
        self,
        conn: Connection,
        topology: Topology,
        places: Iterable[Mapping[str, str]],
        hardware_places: Iterable[Mapping[str, str]],
        windows: Sequence[MaintenanceWindow],
        now: datetime,
    ) -> tuple[dict[str, InfraState], dict[str, Sighting]]:
        """The stored incidents of the batch's elements, and the hardware alerts the store
        holds within the window under the elements of the batch's hardware alerts that have
        no open incident (this batch's included: the intake stored it). Nothing is read when
        the batch holds no hardware alert, nor once every element it touches is open (a
        storm under an open incident costs one state read per batch)."""
        keys = {f"{level}={element}" for place in places for level, element in place.items()}
        if not keys:
            return {}, {}
        states = {
            key: InfraState.from_json(data)
            for key, data in (await load_states(conn, INFRA_SCOPE, keys)).items()
        }
        counted: set[str] = set()
        for place in hardware_places:
            place_keys = [f"{level}={element}" for level, element in place.items()]
            if not any((state := states.get(key)) is not None and state.open for key in place_keys):
                counted.update(place_keys)  # an open incident would take the alert first
        if not counted:
            return states, {}
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
            )
            for row in await recent_on_nodes(conn, nodes, since)
            if not muted_by(windows, row.labels, now)
        ]
        return states, sightings(recent, topology, self.policy)

    async def _escalate(
        self,
        conn: Connection,
        drafts: list[NotificationDraft],
        resolved_alert_ids: list[int],
        now: datetime,
    ) -> list[NotificationDraft]:
        """Page drafts open escalations instead of calling once; calls due now are returned."""
        assert self.paging is not None
        pages = [d for d in drafts if self.paging.is_page(d)]
        others = await self.paging.annotate(
            conn, [d for d in drafts if not self.paging.is_page(d)], now
        )
        return others + await self.paging.page(conn, pages, resolved_alert_ids, now)

    async def tick(self, conn: Connection, now: datetime) -> int:
        """Fires due timers (held resolutions, storm summaries, calm storms)."""
        calls = await self.paging.tick(conn, now) if self.paging is not None else []
        calls_written = await insert_notifications(conn, calls, now)
        if self.maintenance is not None:  # notices held by windows that ended, "ends soon"
            owed = await self.maintenance.tick(conn, now)
            if self.paging is not None:
                owed = await self._escalate(conn, owed, [], now)
            calls_written += await insert_notifications(conn, owed, now)
        due_fps = await claim_due(conn, FINGERPRINT_SCOPE, now)
        due_storms = await claim_due(conn, STORM_SCOPE, now)
        fp_states = [FingerprintState.from_json(data) for data in due_fps.values()]
        held = [fp.alert_id for fp in fp_states if fp.alert_id is not None]
        book = await self.incidents.book_for_tick(conn, held, now)
        if not due_fps and not due_storms and not book.changed:
            return calls_written
        # A released resolution may touch a storm that is not itself due: load those too.
        extra_jobs = {
            job_key(dict(fp.context.get("alert", {}).get("labels", {}))) for fp in fp_states
        } - set(due_storms)
        storms = {**due_storms, **(await load_states(conn, STORM_SCOPE, extra_jobs))}
        result = decide_tick(
            fp_states,
            [StormState.from_json(data) for data in storms.values()],
            policy=self.policy,
            now=now,
            channels=self.channels,
            job_routes=self.job_routes() if self.job_routes is not None else None,
            incidents=book,
            updatable=self.updatable,
        )
        if self.metrics is not None:
            self.metrics.observe(result)
        ended_pages = resolved_pages(book)
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
        drafts = list(result.drafts)
        if self.maintenance is not None:
            drafts = await self.maintenance.mute(conn, drafts, now, self.archive_channels)
        if self.paging is not None:
            drafts = await self._escalate(conn, drafts, ended_pages, now)
        written = await insert_notifications(conn, drafts, now) + calls_written
        self.drafted += written
        return written
