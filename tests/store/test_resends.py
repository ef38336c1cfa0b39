"""What "unchanged" means (store/resends.py): the content digest of a webhook's alerts,
which contents may be answered from the store at all, and the read that answers them (its
plan on SQLite and the real PostgreSQL). Bodies as Alertmanager sends them."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.store.bulk import encoder, fetch
from trainsentry.store.resends import (
    ResendProbe,
    known_resend,
    known_resend_sql,
    resend_probe,
)
from trainsentry.store.writes import IncomingReceipt, record_receipts


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


async def resend_plan(engine: AsyncEngine, probe: ResendProbe) -> list[str]:
    async with engine.connect() as conn:
        sql, params = known_resend_sql(probe, encoder(conn))
        if conn.dialect.name == "sqlite":
            return [row[-1] for row in await fetch(conn, f"EXPLAIN QUERY PLAN {sql}", params)]
        return [row[0] for row in await fetch(conn, f"EXPLAIN {sql}", params)]


def assert_looked_up_by_occurrence(plan: list[str]) -> None:
    looked_up = (
        "SEARCH a USING INDEX sqlite_autoindex_alerts_1 (fingerprint=? AND starts_at=?)",
        "Index Scan using uq_alerts_occurrence on alerts a",
    )
    assert any(index in step for step in plan for index in looked_up), plan
    read_all = ("ix_alerts_status_id", "Seq Scan on alerts", "SCAN a")
    assert not any(scan in step for step in plan for scan in read_all), plan


async def test_the_resend_read_looks_each_occurrence_up_by_its_index(engine: AsyncEngine) -> None:
    """The read behind every recognised resend must cost the same with 100,000 firing alerts
    stored as with 50: each of the body's occurrences looked up through the unique index,
    never every firing alert read. Joined, SQLite read them all through the status index, and
    PostgreSQL hashed the whole table while it believed it small (new alerts, statistics not
    updated yet): a resend cost more with every alert stored."""
    body = parsed([make_alert(i) for i in range(50)])
    async with engine.begin() as conn:
        await record_receipts(conn, [body])
    probe = resend_probe(body)
    assert probe is not None
    assert_looked_up_by_occurrence(await resend_plan(engine, probe))
    if engine.dialect.name == "postgresql":  # and with a big table, analysed
        async with engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO alerts (fingerprint, starts_at, alertname, status, labels, "
                "annotations, generator_url, job_namespace, job_name, node, created_at, "
                "last_received_at) SELECT 'bulk-' || n, now(), 'Bulk', 'firing', '{}', '{}', "
                "'', '', '', '', now(), now() FROM generate_series(1, 100000) AS n"
            )
            await conn.exec_driver_sql("ANALYZE alerts")
        assert_looked_up_by_occurrence(await resend_plan(engine, probe))
    async with engine.connect() as conn:
        assert await known_resend(conn, probe) is not None
