"""What "unchanged" means (store/resends.py): the content digest of a webhook's alerts, and
which contents may be answered from the store at all. Bodies as Alertmanager sends them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.store.writes import IncomingReceipt


def parsed(alerts: list[dict[str, Any]], **extra: Any) -> IncomingReceipt:
    return parse_webhook(encode({**make_body(alerts), **extra}))


def digest(alerts: list[dict[str, Any]], **extra: Any) -> str:
    return parsed(alerts, **extra).content_digest


GROUP = [make_alert(i) for i in range(5)]


def test_the_order_of_the_alerts_and_the_body_around_them_do_not_count() -> None:
    assert digest(GROUP) == digest(list(reversed(GROUP)))
    # what Alertmanager says about the notification, not about the alerts
    assert digest(GROUP) == digest(
        GROUP,
        notification_reason="repeat interval elapsed",
        externalURL="http://alertmanager-1.local",
        commonAnnotations={"summary": "x"},
    )


def test_repeats_of_one_occurrence_keep_their_order() -> None:
    """The store applies them in order: firing then resolved ends resolved."""
    firing, resolved = make_alert(1), make_alert(1, status="resolved")
    assert digest([firing, resolved]) != digest([resolved, firing])


def _changed(field: str) -> dict[str, Any]:
    alert = make_alert(2)
    if field in ("labels", "annotations"):
        return {**alert, field: {**alert[field], "extra": "1"}}
    value = {
        "fingerprint": "00000000000000ff",
        "startsAt": "2026-11-20T03:00:07Z",
        "status": "resolved",
        "endsAt": "2026-11-20T04:00:00Z",
        "generatorURL": "http://prometheus.local/other",
    }[field]
    return {**alert, field: value}


@pytest.mark.parametrize(
    "field",
    ["fingerprint", "startsAt", "status", "endsAt", "labels", "annotations", "generatorURL"],
)
def test_every_field_of_an_alert_counts(field: str) -> None:
    changed = [_changed(field) if i == 2 else alert for i, alert in enumerate(GROUP)]
    assert digest(changed) != digest(GROUP)


def test_times_count_as_stored_milliseconds_in_utc() -> None:
    """A webhook carries nanoseconds, Alertmanager's API v2 milliseconds: one occurrence."""
    nanos = {**make_alert(3), "startsAt": "2026-11-20T04:00:03.123456789+01:00"}
    millis = {**make_alert(3), "startsAt": "2026-11-20T03:00:03.123Z"}
    assert digest([nanos]) == digest([millis])


def test_only_whole_lists_of_alerts_firing_without_ends_at_are_skippable() -> None:
    assert parsed(GROUP).skippable
    assert not parsed([]).skippable
    assert not parsed([*GROUP, make_alert(9, status="resolved")]).skippable
    ends = BASE_TIME.replace(hour=9)
    assert not parsed([*GROUP, make_alert(9, ends_at=ends)]).skippable
    truncated = parsed(GROUP, truncatedAlerts=3)
    assert not truncated.skippable
    assert truncated.content_digest == "", "a cut list says nothing of the whole group"
