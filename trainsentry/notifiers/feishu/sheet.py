"""Feishu Sheets archive: one row per alert occurrence, updated in place when it resolves.

Rows go to one sheet per month (title `alerts-YYYY-MM` by default, from the occurrence's
start), created with a header row when missing. Concurrent `send` calls are collected for
`batch_window_s` and written with one `values_append` per sheet (up to
`max_rows_per_call` rows) plus one `values_batch_update` for the rows that already exist;
each `send` returns when its row is written, or raises the batch's error.

Which row holds an occurrence is learned from the append answer (`updatedRange`) and, after
a restart or a failed call, re-read from column A, so a retried notification updates its
row instead of appending a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsentry.config.channels import FeishuSheetSettings
from trainsentry.notifiers.base import (
    NotifierError,
    OutboundNotification,
    PermanentError,
    Receipt,
    RetryableError,
)
from trainsentry.notifiers.feishu.app import FeishuAppClient
from trainsentry.notifiers.payload_contract import PayloadError, parse_payload
from trainsentry.notifiers.ratelimit import RateGate, RateLimit
from trainsentry.notifiers.rows import COLUMNS, occurrence_key, occurrence_month, row_from_payload

log = logging.getLogger(__name__)

CHANNEL = "feishu_sheet"
# Feishu: values_append / values_batch_update 100 requests/s per app. Rows are batched, so
# the outbox needs no per-notification limit for this channel (`rate_limits` is empty).
API_RATE_LIMITS: tuple[RateLimit, ...] = (RateLimit(100, 1.0),)
LAST_COLUMN = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(COLUMNS) - 1]
_UPDATED = re.compile(r"!([A-Z]+)(\d+)(?::([A-Z]+)(\d+))?$")


def first_row_of(updated_range: str) -> int:
    """`sid!A5:P7` -> 5."""
    match = _UPDATED.search(updated_range)
    if not match:
        raise RetryableError(f"cannot read the appended range {updated_range!r}")
    return int(match.group(2))


@dataclass
class _Pending:
    key: str
    title: str
    row: list[str]
    done: asyncio.Future[str] = field(repr=False)


class FeishuSheetArchive:
    """The `feishu_sheet` channel."""

    rate_limits: tuple[RateLimit, ...] = ()

    def __init__(
        self,
        client: FeishuAppClient,
        spreadsheet_token: str,
        *,
        name: str = CHANNEL,
        title_format: str = "alerts-%Y-%m",
        batch_window_s: float = 0.5,
        max_rows_per_call: int = 500,
    ) -> None:
        self.name = name
        self.client = client
        self.spreadsheet_token = spreadsheet_token
        self.title_format = title_format
        self.batch_window_s = batch_window_s
        self.max_rows_per_call = max_rows_per_call
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._gate = RateGate(API_RATE_LIMITS, max_wait=5.0)
        self._sheet_ids: dict[str, str] = {}  # title -> sheet id
        self._rows: dict[str, dict[str, int]] = {}  # sheet id -> occurrence key -> row
        self.api_calls = 0

    @classmethod
    def from_settings(
        cls, settings: FeishuSheetSettings, client: FeishuAppClient
    ) -> FeishuSheetArchive:
        return cls(
            client,
            settings.spreadsheet_token,
            title_format=settings.sheet_title_format,
            batch_window_s=settings.batch_window_s,
            max_rows_per_call=settings.max_rows_per_call,
        )

    # ------------------------------------------------------------------ channel
    async def send(self, notification: OutboundNotification) -> Receipt:
        if notification.kind == "storm":
            return Receipt(channel=self.name, detail={"skipped": "storm summaries are not rows"})
        try:
            payload = parse_payload(notification.payload)
        except PayloadError as exc:
            raise PermanentError(str(exc)) from exc
        item = _Pending(
            key=occurrence_key(payload),
            title=occurrence_month(payload).strftime(self.title_format),
            row=row_from_payload(payload),
            done=asyncio.get_running_loop().create_future(),
        )
        self._pending.append(item)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_after_window())
        where = await item.done
        return Receipt(channel=self.name, provider_id=where, detail={"occurrence": item.key})

    async def flush(self) -> None:
        """Writes everything pending now (used on shutdown and in tests)."""
        async with self._write_lock:
            batch, self._pending = self._pending, []
            if batch:
                await self._write(batch)

    async def _flush_after_window(self) -> None:
        await asyncio.sleep(self.batch_window_s)
        # Rows that arrive while a batch is being written go out right after it.
        while self._pending:
            await self.flush()

    async def aclose(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            await self._flusher
        await self.flush()
        await self.client.aclose()

    # ------------------------------------------------------------------ batching
    async def _write(self, batch: list[_Pending]) -> None:
        by_title: dict[str, list[_Pending]] = {}
        for item in batch:
            by_title.setdefault(item.title, []).append(item)
        for title, items in by_title.items():
            try:
                await self._write_sheet(title, items)
            except NotifierError as exc:
                self._forget(title)
                self._fail(items, exc)
            except Exception as exc:  # never leave a sender waiting forever
                self._forget(title)
                self._fail(items, RetryableError(f"sheet write failed: {exc!r}"))

    @staticmethod
    def _fail(items: Sequence[_Pending], exc: NotifierError) -> None:
        for item in items:
            if not item.done.done():
                item.done.set_exception(exc)

    def _forget(self, title: str) -> None:
        """After a failure we no longer know what reached the sheet: re-read it next time."""
        sheet_id = self._sheet_ids.pop(title, None)
        if sheet_id is not None:
            self._rows.pop(sheet_id, None)

    async def _write_sheet(self, title: str, items: list[_Pending]) -> None:
        sheet_id = await self._sheet_id(title)
        rows = await self._row_index(sheet_id)
        # The last notification of an occurrence in the batch carries its newest state.
        latest: dict[str, _Pending] = {}
        for item in items:
            latest[item.key] = item
        updates = [item for key, item in latest.items() if key in rows]
        appends = [item for key, item in latest.items() if key not in rows]
        for start in range(0, len(appends), self.max_rows_per_call):
            chunk = appends[start : start + self.max_rows_per_call]
            first = await self._append(sheet_id, [item.row for item in chunk])
            for offset, item in enumerate(chunk):
                rows[item.key] = first + offset
        if updates:
            await self._batch_update(sheet_id, [(rows[item.key], item.row) for item in updates])
        for item in items:
            if not item.done.done():
                item.done.set_result(f"{sheet_id}!A{rows[item.key]}")
        log.info(
            "event=sheet_written sheet=%s appended=%d updated=%d",
            title, len(appends), len(updates),
        )  # fmt: skip

    # ------------------------------------------------------------------ API calls
    async def _api(
        self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        slot = await self._gate.acquire()
        while isinstance(slot, float):  # over the per-app limit: a batch may simply wait
            await asyncio.sleep(slot)
            slot = await self._gate.acquire()
        self.api_calls += 1
        try:
            return await self.client.call(method, path, params=params, body=body)
        finally:
            self._gate.done(slot)

    def _path(self, version: str, tail: str) -> str:
        return f"/open-apis/sheets/{version}/spreadsheets/{self.spreadsheet_token}/{tail}"

    async def _sheet_id(self, title: str) -> str:
        if title in self._sheet_ids:
            return self._sheet_ids[title]
        data = await self._api("GET", self._path("v3", "sheets/query"))
        for sheet in data.get("sheets") or []:
            self._sheet_ids[str(sheet.get("title"))] = str(sheet.get("sheet_id"))
        if title not in self._sheet_ids:
            body = {"requests": [{"addSheet": {"properties": {"title": title}}}]}
            answer = await self._api("POST", self._path("v2", "sheets_batch_update"), body=body)
            replies = answer.get("replies") or [{}]
            sheet_id = ((replies[0].get("addSheet") or {}).get("properties") or {}).get("sheetId")
            if not sheet_id:
                raise RetryableError(f"Feishu did not return the new sheet {title!r}")
            self._sheet_ids[title] = str(sheet_id)
            await self._append(str(sheet_id), [list(COLUMNS)])
            self._rows[str(sheet_id)] = {COLUMNS[0]: 1}
            log.info("event=sheet_created title=%s sheet_id=%s", title, sheet_id)
        return self._sheet_ids[title]

    async def _row_index(self, sheet_id: str) -> dict[str, int]:
        """Occurrence key -> row number, read from column A once per sheet."""
        if sheet_id in self._rows:
            return self._rows[sheet_id]
        data = await self._api("GET", self._path("v2", f"values/{sheet_id}!A:A"))
        values = (data.get("valueRange") or {}).get("values") or []
        index = {str(row[0]): n for n, row in enumerate(values, start=1) if row and row[0]}
        self._rows[sheet_id] = index
        if not index:  # an empty sheet someone created by hand: give it the header
            await self._append(sheet_id, [list(COLUMNS)])
            index[COLUMNS[0]] = 1
        return index

    async def _append(self, sheet_id: str, rows: list[list[str]]) -> int:
        data = await self._api(
            "POST",
            self._path("v2", "values_append"),
            params={"insertDataOption": "INSERT_ROWS"},
            body={
                "valueRange": {"range": f"{sheet_id}!A1:{LAST_COLUMN}{len(rows)}", "values": rows}
            },
        )
        updated = (data.get("updates") or {}).get("updatedRange") or data.get("tableRange") or ""
        return first_row_of(str(updated))

    async def _batch_update(self, sheet_id: str, rows: list[tuple[int, list[str]]]) -> None:
        ranges = [
            {"range": f"{sheet_id}!A{n}:{LAST_COLUMN}{n}", "values": [row]} for n, row in rows
        ]
        await self._api(
            "POST", self._path("v2", "values_batch_update"), body={"valueRanges": ranges}
        )
