"""A schedule as an iCalendar (RFC 5545) feed, rendered by the `icalendar` library.

One VEVENT per stretch of time during which the same person, through the same layer (or an
override), is first on call; stretches when nobody is on call have none. Times are UTC
(`...Z`), so every calendar client shows them in its own zone without a VTIMEZONE. Events are
clipped to the range asked for; the UID is stable for a stretch that starts inside it.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

from icalendar import Calendar, Event

from trainsentry.oncall.schedule import timeline
from trainsentry.oncall.types import OVERRIDE_LAYER, Schedule

PRODID = "-//trainsentry//oncall//EN"
FEED_KEY_CONTEXT = b"trainsentry oncall feed v1\x00"  # keys of other uses never collide


def feed_key(secret: str, schedule: str) -> str:
    """Pure: the subscription key of `schedule`'s feed: HMAC-SHA256 of the schedule's name
    under the gateway's `secret` (its read token), 32 hex digits (128 bits). A key opens one
    schedule's feed only, reveals nothing of the secret, and changes when the secret does."""
    mac = hmac.new(secret.encode(), FEED_KEY_CONTEXT + schedule.encode(), hashlib.sha256)
    return mac.hexdigest()[:32]


def primary_stretches(
    schedule: Schedule, start: datetime, end: datetime
) -> list[tuple[datetime, datetime, str, str]]:
    """Pure: (start, end, name, layer) of who is first on call, merged where it continues."""
    out: list[tuple[datetime, datetime, str, str]] = []
    for segment in timeline(schedule, start, end):
        if not segment.entries:
            continue
        name, layer = segment.entries[0]
        if out and out[-1][1] == segment.start and out[-1][2:] == (name, layer):
            out[-1] = (out[-1][0], segment.end, name, layer)
        else:
            out.append((segment.start, segment.end, name, layer))
    return out


def render_ics(schedule: Schedule, start: datetime, end: datetime, stamp: datetime) -> bytes:
    """Pure: the feed of `schedule` from `start` to `end`; `stamp` (the time of rendering)
    becomes every event's DTSTAMP."""
    calendar = Calendar()
    calendar.add("prodid", PRODID)
    calendar.add("version", "2.0")
    calendar.add("calscale", "GREGORIAN")
    calendar.add("x-wr-calname", f"On call: {schedule.name}")
    for begin, finish, name, layer in primary_stretches(schedule, start, end):
        role = "override" if layer == OVERRIDE_LAYER else f"layer {layer}"
        key = f"{schedule.name}|{name}|{layer}|{begin.astimezone(UTC).isoformat()}"
        event = Event()
        event.add("uid", hashlib.sha256(key.encode()).hexdigest()[:32] + "@trainsentry")
        event.add("dtstamp", stamp.astimezone(UTC))
        event.add("dtstart", begin.astimezone(UTC))
        event.add("dtend", finish.astimezone(UTC))
        event.add("summary", f"{name} on call ({schedule.name}, {role})")
        event.add("categories", [schedule.name])
        event.add("transp", "TRANSPARENT")
        calendar.add_component(event)
    ical: bytes = calendar.to_ical()
    return ical
