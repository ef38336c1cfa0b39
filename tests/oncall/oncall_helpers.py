"""Builds schedules through the real config parser, and writes instants tersely."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trainsentry.oncall.config import parse_oncall
from trainsentry.oncall.types import Schedule

PEOPLE = {name: {} for name in ("alice", "bob", "carol", "dave", "erin", "frank")}


def schedule(timezone: str, layers: list[dict[str, Any]], overrides: Any = ()) -> Schedule:
    config = parse_oncall(
        {
            "people": PEOPLE,
            "schedules": {
                "s": {"timezone": timezone, "layers": layers, "overrides": list(overrides)}
            },
        }
    )
    return config.schedules["s"]


def utc(text: str) -> datetime:
    """'2026-10-26T08:00' read as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)
