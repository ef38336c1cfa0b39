"""Channels that write what would be sent to files instead of sending it (for the demo).

They render with the real channel code (Feishu card builder, archive rows), so the preview is
what Feishu, the sheet and the phone provider would receive.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsentry.notifiers.base import OutboundNotification, Receipt
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.notifiers.rows import COLUMNS, row_from_payload


@dataclass
class Sent:
    """One previewed notification, for the HTML timeline."""

    channel: str
    notification: OutboundNotification
    rendered: dict[str, Any] | list[str]
    file: str = ""
    updates: str = ""  # the file of the card this one updates in place ("" a new message)


@dataclass
class PreviewLog:
    items: list[Sent] = field(default_factory=list)


class CardPreview:
    """The Feishu group, as the Feishu app shows it: one card JSON file per new card
    (`NNNNN-P1.json`), and an incident's card drawn again in place (a redraw, an ack) as an
    update of that card (`NNNNN-P1.update-MMMMM.json`, MMMMM: the card it updates)."""

    updates_cards = True  # like the Feishu app: incidents' cards are redrawn in place

    def __init__(self, out: Path, log: PreviewLog, name: str = "feishu") -> None:
        self.name = name
        self._dir = out / "cards"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._log = log
        self._cards: dict[str, str] = {}  # outbox group -> the file of its card
        self.updates = 0

    async def send(self, notification: OutboundNotification) -> Receipt:
        card = build_card(notification.kind, parse_payload(notification.payload))
        payload = notification.payload
        redraw = notification.kind == "ack" or bool(payload.get("redraw"))
        first = self._cards.get(notification.group_key) if redraw else None
        name = f"{notification.id:05d}-{notification.priority}"
        if first is not None:
            name += f".update-{first.split('-', 1)[0]}"
            self.updates += 1
        path = self._dir / f"{name}.json"
        path.write_text(json.dumps({"msg_type": "interactive", "card": card}, indent=2))
        if first is None:
            self._cards[notification.group_key] = path.name
        self._log.items.append(Sent(self.name, notification, card, path.name, first or ""))
        return Receipt(channel=self.name, provider_id=first or path.name)

    async def aclose(self) -> None:
        return None


class SheetPreview:
    """The spreadsheet archive: one row per occurrence, updated in place on resolve (as the
    Feishu sheet is), written out as CSV with the sheet's columns."""

    def __init__(self, out: Path, log: PreviewLog, name: str = "sheet") -> None:
        self.name = name
        self._path = out / "sheet.csv"
        self._log = log
        self._rows: dict[str, list[str]] = {}
        self._write()

    def _write(self) -> None:
        with self._path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            writer.writerows(self._rows.values())

    async def send(self, notification: OutboundNotification) -> Receipt:
        if notification.kind == "storm":  # the sheet archives occurrences, not summaries
            return Receipt(channel=self.name, detail={"skipped": "storm summary"})
        row = row_from_payload(parse_payload(notification.payload))
        self._rows[row[0]] = row  # column A is the occurrence key
        self._write()
        return Receipt(channel=self.name)

    async def aclose(self) -> None:
        return None


class CallPreview:
    """The phone channel: who would be called, one JSON line per call."""

    def __init__(self, out: Path, log: PreviewLog, on_call: str, name: str = "phone") -> None:
        self.name = name
        self._path = out / "calls.jsonl"
        self._path.write_text("")
        self._on_call = on_call
        self._log = log

    async def send(self, notification: OutboundNotification) -> Receipt:
        payload = notification.payload
        call = {
            "to": self._on_call,
            "priority": notification.priority.value,
            "alertname": payload.get("alertname", ""),
            "job": payload.get("job", ""),
            "say": f"{notification.priority.value} alert {payload.get('alertname', '')} "
            f"on job {payload.get('job', 'unknown')}. Acknowledge in Feishu.",
        }
        with self._path.open("a") as handle:
            handle.write(json.dumps(call) + "\n")
        self._log.items.append(Sent(self.name, notification, call))
        return Receipt(channel=self.name)

    async def aclose(self) -> None:
        return None
