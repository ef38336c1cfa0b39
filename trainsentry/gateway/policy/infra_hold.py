"""The hold: a hardware alert waits for its element's incident before it speaks alone (pure).

A topology element's failure reaches the gateway in pieces: Prometheus fires each node's
alerts in the evaluation after its own scrape saw the fault, and Alertmanager sends the
alerts of a group that came after its first notification one `group_interval` later (1 m
for P0). The first piece may hold fewer than `infrastructure.nodes` nodes: below the
threshold no element's incident takes it (infra.py), and announced at once its incident
would lead with one node's port, page, and go on paging and following up beside the
element's incident the next piece opens (issue 44: a third call 5 minutes in, the
escalation's repeat of that node's page).

So an incident announced by a firing of a trusted hardware alert on a placed node that no
element's incident took (`holding`) is held: its cards and page wait
`infrastructure.hold` seconds (`IncidentState.held`: until when, the element keys of the
alert's place, and whether a page is owed). Then:
- an alert of it that an element's incident takes meanwhile (`notice_incident._fold_infra`) ends
  the hold: the incident is quiet (`take`), never announced on its own: the element's
  incident speaks for it, pages for it, and takes its later alerts;
- when the hold ends (the ticker wakes it at `until`), an incident one of whose elements has
  an open incident is quiet too (it joins that element: `IncidentState.infra`), else it is
  announced as it would have been: its card, and the page its announcement (or a fresh P0
  that joined it meanwhile) owed, if it still fires as a P0 nobody acked.

Invariants: a held incident writes no draft before `until`; a hold only starts on an
incident nobody was told of (no channel told, no page), so holding never withdraws a card or
a call already made; a held incident that resolves before `until` and is not woken again is
never announced (as an alert Alertmanager's `group_wait` saw fire and resolve).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from trainsentry.alerts import Alert, Priority
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.incident import FIRING, IncidentState
from trainsentry.gateway.policy.infra import InfraFold

UNTIL, ELEMENTS, PAGE = "until", "elements", "page"


def holding(fold: InfraFold, alert: Alert, classification: Classification) -> tuple[str, ...]:
    """Pure: the element keys whose incident a hardware alert `fold` did not take waits for
    (those of its node's place) when `infrastructure.hold` is on; () for an alert no
    element's incident could take (a tenant's, a node without a place)."""
    infrastructure = fold.policy.infrastructure
    if infrastructure.hold <= 0:
        return ()
    component = fold.component(alert, classification)
    if not component or component not in infrastructure.hold_components:
        return ()
    return fold.keys()


def start(state: IncidentState, elements: Collection[str], at: datetime, hold: float) -> None:
    """Holds an incident just announced (`notice_incident._announce`) whose alert waits for
    `elements`, if nobody was told of it yet, with the page its announcement owes
    (`page_due`); changes `state` in place, as the others do."""
    if not elements or hold <= 0 or state.told or state.paged or state.held:
        return
    if not state.announced or state.folded:
        return
    until = at + timedelta(seconds=hold)
    state.held = {UNTIL: until.isoformat(), ELEMENTS: sorted(elements), PAGE: state.page_due}


def take(state: IncidentState) -> None:
    """An element's incident took an alert of a held incident: it is quiet from now on."""
    if state.held:
        state.held = {}
        _quiet(state)


def release(state: IncidentState, now: datetime, open_elements: Collection[str]) -> bool:
    """Whether the incident's drafts may be written now (False while held). At the end of its
    hold: quiet, joining the first of its elements whose incident is open, or announced with
    the page it owes (a firing P0 nobody acked and nobody was called for). A held incident
    owes the ticker a wake-up at `until` (`due_at`)."""
    if not state.held:
        return True
    until = datetime.fromisoformat(state.held[UNTIL])
    if now < until:
        state.held[PAGE] = bool(state.held.get(PAGE)) or state.page_due  # a fresh P0 joined
        state.due_at = min(state.due_at, until) if state.due_at else until
        return False
    elements = [key for key in state.held[ELEMENTS] if key in open_elements]
    owed = bool(state.held.get(PAGE))
    state.held, state.due_at = {}, None  # the drafts (or nothing) set the next due time
    if elements:
        state.infra = state.infra or elements[0]
        _quiet(state)
        return True
    state.page_due = (
        owed
        and state.status == FIRING
        and state.priority is Priority.P0
        and not state.paged
        and not state.acked_by
    )
    return True


def _quiet(state: IncidentState) -> None:
    """Never announced on its own: no card, no page (`incident_cards.incident_drafts`)."""
    state.announced = False
    state.page_due = False


def held_elements(states: Collection[IncidentState]) -> set[str]:
    """Pure: the element keys the held incidents among `states` wait for."""
    return {key for state in states if state.held for key in state.held.get(ELEMENTS, ())}
