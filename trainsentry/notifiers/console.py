"""The console channel: the default. Each notification becomes one JSON line in a file (if
configured) and one readable log line. Replays of the same notification (after a crash between
writing and marking it sent) are recognised by idempotency key and not written twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from trainsentry.notifiers.base import OutboundNotification, Receipt

log = logging.getLogger("trainsentry.console")


def summary_line(notification: OutboundNotification) -> str:
    """One human line: priority, kind, alert name, job and the summary annotation."""
    payload = notification.payload
    labels = payload.get("labels") or {}
    annotations = payload.get("annotations") or {}
    job = payload.get("job") or labels.get("trainingjob") or labels.get("namespace") or "-"
    name = payload.get("alertname") or labels.get("alertname") or notification.kind
    text = payload.get("summary") or annotations.get("summary") or ""
    if notification.kind == "storm":
        storm = payload.get("storm") or {}
        text = f"{storm.get('total', '?')} alerts collapsed"
    event = str(payload.get("event") or notification.kind).upper()
    return f"[{notification.priority}] {event} {name} job={job} {text}".strip()


class ConsoleNotifier:
    name = "console"

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._written: set[str] = set()
        self._lock = asyncio.Lock()
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    self._written.add(json.loads(line)["idempotency_key"])
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from a crash

    async def send(self, notification: OutboundNotification) -> Receipt:
        log.info("%s", summary_line(notification))
        if self._path is None:
            return Receipt(channel=self.name)
        async with self._lock:
            if notification.idempotency_key in self._written:
                return Receipt(channel=self.name, detail={"duplicate": True})
            record = {
                "id": notification.id,
                "idempotency_key": notification.idempotency_key,
                "kind": notification.kind,
                "priority": notification.priority.value,
                "created_at": notification.created_at.isoformat(),
                "text": summary_line(notification),
                "payload": notification.payload,
            }
            line = json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"
            await asyncio.to_thread(self._append, line)
            self._written.add(notification.idempotency_key)
        return Receipt(channel=self.name, provider_id=str(notification.id))

    def _append(self, line: str) -> None:
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._path.open("a", encoding="utf-8") as handle:
            handle.write(line)

    async def aclose(self) -> None:
        return None
