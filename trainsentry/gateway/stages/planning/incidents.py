"""The incidents of a planning batch, loaded from and written to the store.

`IncidentLedger.book` loads what a batch's changes touch (the open incidents of their keys,
the incidents their alerts are in, locked on PostgreSQL) and reserves ids for the incidents
the batch may open; `save` writes the changed incidents and the new memberships, in the
planning transaction, so a change and its incident commit together or not at all. The
decisions are the pure policy's (gateway/policy/incident.py). The failure-domain index
(correlate.py: node, job and twin identity -> the incident their alerts join) is kept as
policy state (scope `correlation`), loaded and written in the same transaction.

The ledger keeps the states it wrote, with their text (issue 46: a storm's incident is a
megabyte of JSON that every batch read again): a row that still holds exactly that text is
not decoded, its kept state is taken. Invariant: a batch plans with the same states either
way (tests/gateway/stages/planning/test_incident_kept.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from trainsentry.alerts import AlertChange
from trainsentry.gateway.policy.correlate import domain_keys
from trainsentry.gateway.policy.incident import (
    FIRING,
    TWIN_DOMAIN,
    IncidentBook,
    IncidentState,
    base_key,
    cause_of,
)
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.twins import twin_identity
from trainsentry.store.engine import Connection
from trainsentry.store.incidents import (
    IncidentRow,
    MemberRow,
    StoredIncident,
    due_incidents,
    load_incidents,
    reserve_ids,
    save_incidents,
)
from trainsentry.store.policy_state import load_states, save_states

CORRELATION_SCOPE = "correlation"


def state_of(stored: StoredIncident) -> IncidentState:
    """The policy's incident from its row (the ack's columns included)."""
    return IncidentState.from_json(stored.state, acked_by=stored.acked_by)


def as_loaded(state: IncidentState, acked_by: str | None) -> IncidentState:
    """`state`, as written, made what `state_of` gives for its row: the batch-only fields
    (not stored) cleared and the ack's column taken. Invariant: for a state the planner
    saved, equal to `state_of` of the row read back (`IncidentState.to_json` is plain JSON:
    tests/gateway/stages/planning/test_incident_kept.py)."""
    state.trigger, state.trigger_alert_id = "", None
    state.page_due = state.dirty = False
    state.acked_by = acked_by
    return state


# Incidents whose state the ledger keeps as it wrote them, at most (the newest written).
KEPT_MAX = 64


def row_of(state: IncidentState) -> IncidentRow:
    return IncidentRow(
        id=state.id,
        key=state.key,
        status=state.status,
        priority=state.priority.value,
        job=state.job,
        cause=state.cause,
        cause_alert_id=state.lead_alert_id,
        alerts_total=state.total,
        alerts_firing=state.firing,
        opened_at=state.opened_at,
        updated_at=state.updated_at or state.opened_at,
        resolved_at=state.resolved_at,
        due_at=state.due_at if state.status == FIRING else None,
        state=state.to_json(),
    )


class IncidentLedger:
    """Loads and writes the incidents of the planner's batches (one per gateway)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        # incident id -> (its state's text as this ledger last wrote it, that state): a
        # batch that finds the row still holding that text takes the state instead of
        # decoding it (a storm's incident is a megabyte of JSON). Taken out while a batch
        # holds it, put back by `save`: a batch that fails leaves nothing here it changed,
        # and a row written by anyone else (another replica) holds another text.
        self._kept: dict[int, tuple[str, IncidentState]] = {}
        self.kept_hits = 0  # states taken from `_kept` instead of decoded (tests, benches)

    def _states(self, stored: Sequence[StoredIncident]) -> list[IncidentState]:
        """The policy's incidents of `stored` (`load_incidents` given `_kept`'s texts)."""
        states = []
        for row in stored:
            kept = self._kept.pop(row.id, None)
            if row.known and kept is not None:
                self.kept_hits += 1
                states.append(as_loaded(kept[1], row.acked_by))
            else:
                states.append(state_of(row))
        return states

    def kept(self) -> dict[int, IncidentState]:
        """The states kept as written, by incident id (tests, benches)."""
        return {incident_id: state for incident_id, (_, state) in self._kept.items()}

    def forget(self) -> None:
        """Drops the kept states: the next batch decodes every row it reads."""
        self._kept.clear()

    def _known(self) -> dict[int, str]:
        return {incident_id: text for incident_id, (text, _) in self._kept.items()}

    async def book(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        apart: Mapping[int, str],
        prior: Sequence[int] = (),
    ) -> IncidentBook:
        """The incidents `changes` touch, with ids reserved for those they may open: at most
        two per key and cause among the changes not in an incident yet (a key's incident
        may resolve and open again within one batch); a batch that opens more fails with
        `IdsExhausted` and is planned again one change at a time. `apart`: alert id -> the
        maintenance window stretch muting it (`incident.base_key`); `prior`: the firing
        occurrences of the changes' fingerprints (their incidents are loaded too: a newer
        occurrence resolves there)."""
        keys: set[str] = set()
        domains: set[str] = set()
        placed: list[tuple[str, str]] = []  # each change's incident key and cause, once
        for c in changes:
            base = base_key(c.alert, c.group_key, self.policy, apart.get(c.alert_id, ""))
            cause = cause_of(c.alert)
            placed.append((base, cause))
            keys.update((base, f"{base}|cause={cause}"))
            domains.update(domain_keys(c.alert))
            if ident := twin_identity(c.alert):
                domains.add(TWIN_DOMAIN + ident)
        entries = await load_states(conn, CORRELATION_SCOPE, domains)
        keys.update(str(entry["key"]) for entry in entries.values())
        alert_ids = [c.alert_id for c in changes] + list(prior)
        stored, members = await load_incidents(conn, keys, alert_ids, self._known())
        candidates = {
            found for c, found in zip(changes, placed, strict=True) if c.alert_id not in members
        }
        ids = await reserve_ids(conn, 2 * len(candidates))
        states = self._states(stored)
        return IncidentBook(
            self.policy, states, members, ids, apart, rebuild=False, domains=entries
        )

    async def book_for_tick(
        self, conn: Connection, alert_ids: Sequence[int], now: datetime
    ) -> IncidentBook:
        """The incidents of the alerts whose held resolutions the ticker releases, and those
        whose follow-up is due (`IncidentBook.wake`)."""
        stored, members = await load_incidents(conn, (), alert_ids, self._known())
        ids = await reserve_ids(conn, len([a for a in alert_ids if a not in members]))
        states = self._states(stored)
        book = IncidentBook(self.policy, states, members, ids, rebuild=False)
        woken = [s for s in await due_incidents(conn, now) if s.id not in book.by_id]
        for row in woken:
            self._kept.pop(row.id, None)  # decoded here: the batch may change it
        book.wake(state_of(s) for s in woken)
        return book

    async def save(self, conn: Connection, book: IncidentBook, now: datetime) -> None:
        """Writes the book's changed incidents, its memberships and failure-domain entries;
        keeps the states written with their text (`_kept`)."""
        changed = list(book.changed.values())
        members = [
            MemberRow(m.alert_id, m.incident_id, m.role, m.group_key, m.at) for m in book.joined
        ]
        # Only an alert joining an acknowledged incident is acknowledged as it joins: the
        # book holds every incident it adds a member to, read with its ack in this
        # transaction (locked on PostgreSQL, where an ack waits for the commit), so the
        # others need no look.
        maybe_acked = [
            m
            for m in members
            if (state := book.by_id.get(m.incident_id)) is None or state.acked_by is not None
        ]
        rows = [row_of(state) for state in changed]
        texts = await save_incidents(conn, rows, members, maybe_acked)
        for state in changed:
            self._kept.pop(state.id, None)
            if (text := texts.get(state.id)) is not None:
                self._kept[state.id] = (text, state)
        while len(self._kept) > KEPT_MAX:
            del self._kept[next(iter(self._kept))]
        entries = {key: (book.domains[key], None) for key in book.domains_changed}
        await save_states(conn, CORRELATION_SCOPE, entries, now)


def resolved_pages(book: IncidentBook) -> list[int]:
    """The page alert ids of the escalations the batch's resolved incidents end (and the
    incidents forget them: a later firing of theirs may page again)."""
    ended = list(book.pages_ended)  # a lead nobody was told of moved on (`_move_lead`)
    book.pages_ended.clear()
    for state in book.changed.values():
        if state.status != FIRING and state.paged and state.page_alert_id is not None:
            ended.append(state.page_alert_id)
            state.paged = False
    return ended
