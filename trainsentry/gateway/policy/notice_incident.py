"""One notice of an alert, delivered (pure): its incident changes, and the incident is
announced on its own, as the storm's page, or folded into the storm's summary.

A newly firing alert joins its incident (or opens one: incident.py `IncidentBook.place`);
a resolve updates the incident it is in (a copy resolving while its twin fires, or a
resolution not believed yet, leaves it firing: `IncidentBook.resolve`). An incident not
announced yet is announced when it opens outside a storm; during a storm it is folded
into the job's summary unless it pages (the storm's first P0, or a P0 of a new cause:
`storm.verdict`); one announced by a hardware alert under a topology element whose incident
may still open is held for it (infra_hold.py). What an announced incident's cards say is
drafted at the end of the call or batch (`Drafts.flush`).
"""

from __future__ import annotations

from typing import Any

from trainsentry.alerts import Alert, AlertStatus, Priority
from trainsentry.gateway.policy import infra_hold
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.dedup import Decision, FingerprintState, Notice
from trainsentry.gateway.policy.drafts import Drafts
from trainsentry.gateway.policy.incident import (
    INCIDENT_CONTEXT,
    RESOLVED_NOW,
    IncidentState,
)
from trainsentry.gateway.policy.incident_cards import headline
from trainsentry.gateway.policy.storm import StormEntry, Verdict, job_title
from trainsentry.gateway.policy.storm_fold import (
    S,
    announce_start_any,
    collapse_any,
    verdict_any,
)
from trainsentry.gateway.policy.tenancy import CLUSTER_REALM

INFRA_FOLDED = "infra_folded"  # fingerprint context: its resolve went to an incident


def trigger(decision: Decision) -> str:
    """What a change shown on its incident's card is called in idempotency keys."""
    notice = decision.notice.value if decision.notice is not None else ""
    return f"{decision.fingerprint}|{decision.occurrence.isoformat()}|{notice}"


def detail(decision: Decision) -> dict[str, Any]:
    """The counts a lone alert's notice shows on its incident's card."""
    detail: dict[str, Any] = {
        "recurrences": decision.recurrences,
        "flap_transitions": decision.flap_transitions,
        "expired": decision.expired,
    }
    if decision.notice is Notice.RECURRENCE:
        detail["count"] = decision.recurrences + 1
    elif decision.notice is Notice.FLAPPING:
        detail["count"] = decision.flap_transitions
    if decision.held_until is not None:
        detail["held_until"] = decision.held_until.isoformat()
    return detail


def deliver(
    decision: Decision,
    fp: FingerprintState,
    storm: S,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    out: Drafts,
    changes: dict[str, Any],
) -> S:
    """Applies a notice to the alert's incident: a newly firing alert joins one (or opens
    one, announced on its own, as the storm's page, or folded into the storm's summary); a
    resolve updates it. What the incident's cards say is drafted at the end (`flush`)."""
    book = out.incidents
    assert book is not None and decision.notice is not None
    context = dict(changes.get("context") or fp.context)
    # The incident counts a fingerprint firing from its firing notice to its resolved notice
    # (dedup alternates them); a flapping notice on a resolve keeps it firing (held).
    resolving = decision.notice is Notice.RESOLVED
    if resolving or decision.transition is AlertStatus.RESOLVED:
        incident = book.of_alert(alert_id, context)
        if incident is None:  # announced before incidents were kept: it resolves on its own
            incident, _ = book.place(
                alert_id, alert, classification, out.group_key, decision.at, {}
            )
            incident.announced, incident.folded = not fp.collapsed, fp.collapsed
        if resolving:
            outcome = book.resolve(incident, alert, decision.at, classification)
            if outcome != RESOLVED_NOW:
                # a copy whose twin fires, or a resolution not believed yet: the incident
                # still fires on it (its card shows it unknown), nothing is announced as over
                incident.trigger = trigger(decision)
                context[INCIDENT_CONTEXT] = book.note(incident)
                changes["context"] = context
                changes["collapsed"] = incident.folded
                return storm
        else:
            book.touch(incident, decision.at)
    else:
        incident, _ = book.place(
            alert_id, alert, classification, out.group_key, decision.at, context, out.routed_apart
        )
        if out.place and "topology" not in incident.lead:
            incident.lead["topology"] = dict(out.place)
        if alert_id is not None and alert_id in book.diagnosed:
            incident.trigger_alert_id = alert_id  # its drafts wait for its diagnosis
    headline(incident, decision.notice.value, detail(decision))
    incident.trigger = trigger(decision)
    folded_here = (
        bool(context.get(INFRA_FOLDED))
        if decision.transition is not AlertStatus.FIRING
        else _fold_infra(incident, alert, alert_id, classification, decision, out)
    )
    if folded_here:
        out.infra_folded += 1  # the infrastructure incident speaks for it
    elif decision.transition is not AlertStatus.FIRING:
        if incident.folded:
            storm = _fold(storm, incident, alert, classification, decision, alert_id, out)
    elif not incident.announced:
        storm = _announce(storm, incident, alert, classification, decision, alert_id, out)
        if out.infra is not None:
            # under an element whose incident may still open: its cards wait for it
            elements = infra_hold.holding(out.infra, alert, classification)
            infra_hold.start(incident, elements, decision.at, out.policy.infrastructure.hold)
    elif (
        decision.notice is Notice.FIRING
        and incident.priority is Priority.P0
        and not incident.paged
        and not incident.acked_by
    ):
        incident.page_due = True  # a fresh P0 of the incident's cause: its one page
    context[INCIDENT_CONTEXT] = book.note(incident)
    changes["context"] = context
    changes["collapsed"] = incident.folded
    return storm


def _fold_infra(
    incident: IncidentState,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    decision: Decision,
    out: Drafts,
) -> bool:
    """Whether an infrastructure incident takes a firing notice: a hardware alert under an
    element whose incident opens or is open (infra.py `fold_firing`; the alert's incident
    then remembers the element), or any alert joining an incident whose hardware alerts it
    took (the failure's consequences: `fold_consequence`), so such an incident never opens a
    card or an escalation of its own; one held for its element (infra_hold.py) stays quiet.
    A job's own incident (a part of the cluster's) that owes its job's page (infra.py
    `fold_consequence`) is paged by it: keyed by this alert, so an ack of the part stops it, and
    its resolve ends it."""
    infra = out.infra
    if infra is None:
        return False
    # a job's own incident (its part of the cluster's: its route of its own), not acked yet,
    # may owe its job's own page
    own = incident.realm != CLUSTER_REALM and not incident.acked_by
    if infra.fold_firing(alert, alert_id, classification, decision.at):
        incident.infra = incident.infra or infra.taken
    elif not incident.infra or not infra.fold_consequence(
        incident.infra,
        alert,
        alert_id,
        classification,
        decision.at,
        out.pages_apart if own else None,
    ):
        return False
    if infra.paged_job:  # the job's page, tied to this alert: its team's ack stops it
        incident.paged, incident.page_alert_id = True, alert_id
    infra_hold.take(incident)  # held for the element's incident, which now speaks for it
    return True


def _fold(
    storm: S,
    incident: IncidentState,
    alert: Alert,
    classification: Classification,
    decision: Decision,
    alert_id: int | None,
    out: Drafts,
) -> S:
    """Counts the change in the storm's next summary, under its incident; the first
    incident folded announces the storm's start."""
    status = AlertStatus.RESOLVED if decision.notice is Notice.RESOLVED else AlertStatus.FIRING
    label = f"#{incident.id} {incident.cause.split('/', 1)[0]}"
    own = incident.announced  # a page on its own: counted, yet not folded
    out.collapsed += 0 if own else 1
    entry = StormEntry(alert, classification.priority, status, decision.at, alert_id, label, own)
    storm = collapse_any(storm, entry, out.policy)
    if not own:
        storm, messages = announce_start_any(storm, decision.at, out.policy)
        out.storm_messages(messages)
    return storm


def _announce(
    storm: S,
    incident: IncidentState,
    alert: Alert,
    classification: Classification,
    decision: Decision,
    alert_id: int | None,
    out: Drafts,
) -> S:
    """An incident not announced yet (new, or folded into a storm that is over): its own
    cards, the storm's page (the first P0, or a P0 of a new cause: it still counts in the
    summary), or folded into the storm's summary."""
    fresh_page = decision.notice is Notice.FIRING
    storm, how = verdict_any(storm, incident.priority, fresh_page=fresh_page, cause=incident.cause)
    if how is Verdict.COLLAPSE:
        incident.folded = True
        return _fold(storm, incident, alert, classification, decision, alert_id, out)
    incident.announced, incident.folded = True, False
    incident.page_due = fresh_page and incident.priority is Priority.P0 and not incident.acked_by
    if how is Verdict.PAGE:
        total = storm.window_count(decision.at, out.policy.storm)
        incident.storm_note = (
            f"alert storm on {job_title(storm.job)} ({total} new alerts within "
            f"{out.policy.storm.window:g} s): this incident pages on its own"
        )
        storm = _fold(storm, incident, alert, classification, decision, alert_id, out)
    return storm
