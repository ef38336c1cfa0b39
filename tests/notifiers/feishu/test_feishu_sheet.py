"""Feishu Sheets archive against the contract server; CSV/XLSX export of the same rows."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.notifiers.helpers import alert_payload, notification
from tests.support.feishu_server import FeishuContractServer
from trainsentry.alerts import Alert, AlertStatus
from trainsentry.notifiers.base import RetryableError
from trainsentry.notifiers.export import export_rows, rows_to_csv
from trainsentry.notifiers.feishu.app import FeishuAppClient
from trainsentry.notifiers.feishu.sheet import FeishuSheetArchive, first_row_of
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.notifiers.rows import COLUMNS, as_dict, row_from_alert, row_from_payload

TOKEN = "shtcnArchive"


@pytest.fixture
async def server() -> AsyncIterator[FeishuContractServer]:
    async with FeishuContractServer(apps={"cli": "sec"}, spreadsheets={TOKEN}) as srv:
        yield srv


def _archive(server: FeishuContractServer) -> FeishuSheetArchive:
    client = FeishuAppClient(server.base_url, "cli", "sec")
    return FeishuSheetArchive(client, TOKEN, batch_window_s=0.05, max_rows_per_call=40)


def _sheet(server: FeishuContractServer, title: str) -> list[list[object]]:
    [sheet] = [s for s in server.sheets[TOKEN].values() if s.title == title]
    return sheet.rows


def _row(i: int, status: str = "firing", start: str = "2026-11-22T01:00:00Z") -> dict[str, object]:
    extra: dict[str, object] = {"alert_id": i, "starts_at": start}
    if status == "resolved":
        extra["ends_at"] = "2026-11-22T02:20:00Z"
    return alert_payload("P1", status, **extra)


async def test_rows_batched_into_few_calls_then_updated_on_resolve(
    server: FeishuContractServer,
) -> None:
    archive = _archive(server)
    try:
        receipts = await asyncio.gather(
            *(archive.send(notification(i, _row(i), channel="feishu_sheet")) for i in range(100))
        )
        calls_after_firing = list(server.sheet_calls)
        resolved = await archive.send(
            notification(500, _row(7, "resolved"), channel="feishu_sheet")
        )
    finally:
        await archive.aclose()
    rows = _sheet(server, "alerts-2026-11")
    assert rows[0] == list(COLUMNS)
    assert len(rows) == 101  # header + one row per occurrence, the resolve did not append
    # query + add sheet + header + 100 rows in chunks of 40 -> 3 appends.
    assert calls_after_firing == ["query", "add_sheet", "append", "append", "append", "append"]
    assert server.sheet_calls[-1] == "batch_update"
    by_key = {r[0]: r for r in rows[1:]}
    assert set(by_key) == {f"alert-{i}" for i in range(100)}
    seven = as_dict([str(c) for c in by_key["alert-7"]])
    assert seven["status"] == "resolved" and seven["duration"] == "1h20m"
    assert seven["ends_at"] == "2026-11-22T02:20:00Z" and seven["node"] == "gpu-node-07"
    assert resolved.provider_id == receipts[7].provider_id  # same cell, updated in place


async def test_rows_arriving_during_a_write_are_not_stranded(
    server: FeishuContractServer,
) -> None:
    archive = _archive(server)
    try:
        first = [
            asyncio.create_task(archive.send(notification(i, _row(i), channel="feishu_sheet")))
            for i in range(30)
        ]
        for _ in range(2000):  # wait until the first batch is being written
            if "query" in server.sheet_calls:
                break
            await asyncio.sleep(0.005)
        second = [
            asyncio.create_task(archive.send(notification(i, _row(i), channel="feishu_sheet")))
            for i in range(30, 60)
        ]
        await asyncio.wait_for(asyncio.gather(*first, *second), timeout=10)
    finally:
        await archive.aclose()
    assert len(_sheet(server, "alerts-2026-11")) == 61


async def test_new_sheet_per_month(server: FeishuContractServer) -> None:
    archive = _archive(server)
    try:
        await archive.send(notification(1, _row(1), channel="feishu_sheet"))
        await archive.send(
            notification(2, _row(2, start="2026-12-01T00:05:00Z"), channel="feishu_sheet")
        )
    finally:
        await archive.aclose()
    titles = sorted(s.title for s in server.sheets[TOKEN].values())
    assert titles == ["alerts-2026-11", "alerts-2026-12"]
    assert [r[0] for r in _sheet(server, "alerts-2026-12")] == ["occurrence", "alert-2"]


async def test_restart_finds_the_row_again(server: FeishuContractServer) -> None:
    first = _archive(server)
    try:
        for i in range(3):
            await first.send(notification(i, _row(i), channel="feishu_sheet"))
    finally:
        await first.aclose()
    second = _archive(server)  # a new process: knows nothing
    try:
        await second.send(notification(9, _row(1, "resolved"), channel="feishu_sheet"))
    finally:
        await second.aclose()
    rows = _sheet(server, "alerts-2026-11")
    assert [r[0] for r in rows] == ["occurrence", "alert-0", "alert-1", "alert-2"]
    assert rows[2][COLUMNS.index("status")] == "resolved"


async def test_lost_append_answer_is_retried_without_duplicate(
    server: FeishuContractServer,
) -> None:
    archive = _archive(server)
    try:
        await archive.send(notification(0, _row(0), channel="feishu_sheet"))
        server.lose_append_answers = 1
        note = notification(1, _row(1), channel="feishu_sheet")
        with pytest.raises(RetryableError):
            await archive.send(note)
        await archive.send(note)  # what the outbox does next
    finally:
        await archive.aclose()
    keys = [r[0] for r in _sheet(server, "alerts-2026-11")]
    assert keys == ["occurrence", "alert-0", "alert-1"]


async def test_storm_notifications_are_not_rows(server: FeishuContractServer) -> None:
    archive = _archive(server)
    storm = {"priority": "P0", "status": "firing", "storm": {"total": 5}}
    try:
        receipt = await archive.send(notification(1, storm, channel="feishu_sheet", kind="storm"))
    finally:
        await archive.aclose()
    assert receipt.detail["skipped"] and server.sheet_calls == []


def test_first_row_of() -> None:
    assert first_row_of("s1!A5:P7") == 5
    assert first_row_of("s1!A12") == 12
    with pytest.raises(RetryableError):
        first_row_of("garbage")


def test_csv_and_xlsx_export(tmp_path: Path) -> None:
    alert = Alert(
        fingerprint="f1", status=AlertStatus.RESOLVED,
        labels={"alertname": "NodeDown", "node": "n1", "priority": "P0"},
        annotations={"summary": "=HYPERLINK(\"http://evil\")"},
        starts_at=datetime(2026, 11, 22, 1, tzinfo=UTC),
        ends_at=datetime(2026, 11, 22, 1, 5, tzinfo=UTC),
    )  # fmt: skip
    rows = [row_from_alert(alert, alert_id=3, reason="node gone"),
            row_from_payload(parse_payload(alert_payload("P2")))]  # fmt: skip
    parsed = list(csv.DictReader(io.StringIO(rows_to_csv(rows))))
    assert parsed[0]["occurrence"] == "alert-3" and parsed[0]["duration"] == "5m"
    assert parsed[0]["summary"].startswith("'=")  # not a live formula in a spreadsheet
    assert parsed[1]["job"] == "team-a/llama-70b"
    assert export_rows(rows, tmp_path / "alerts.csv").read_text().startswith("occurrence,")
    pytest.importorskip("openpyxl")
    from openpyxl import load_workbook

    path = export_rows(rows, tmp_path / "alerts.xlsx")
    sheet = load_workbook(path).active
    values = [[c.value for c in r] for r in sheet.iter_rows()]
    assert values[0] == list(COLUMNS) and values[1][0] == "alert-3" and values[2][2] == "P2"
