"""The .ics feed, parsed back by the icalendar library: one event per stretch of the person
paged, in UTC, matching the hand-made table of test_cli.py across the October change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from icalendar import Calendar
from oncall_helpers import HANDOFFS

from trainsentry.oncall.config import parse_oncall
from trainsentry.oncall.ical import render_ics

EXAMPLE = Path(__file__).with_name("example.yaml")


def example_schedule():  # type: ignore[no-untyped-def]
    return parse_oncall(yaml.safe_load(EXAMPLE.read_text())["oncall"]).schedules["gpu-infra"]


def test_feed_parses_back_to_the_handoff_table() -> None:
    start = datetime.fromisoformat(HANDOFFS[0][0])
    end = datetime.fromisoformat(HANDOFFS[-1][0])
    stamp = datetime(2026, 10, 1, tzinfo=UTC)
    feed = render_ics(example_schedule(), start, end, stamp)

    calendar = Calendar.from_ical(feed)
    assert calendar["VERSION"] == "2.0" and "trainsentry" in str(calendar["PRODID"])
    events = calendar.walk("VEVENT")
    got = [
        (
            event.decoded("DTSTART"),
            event.decoded("DTEND"),
            str(event["SUMMARY"]),
            event.decoded("DTSTAMP"),
        )
        for event in events
    ]
    expected = [
        (
            datetime.fromisoformat(local),
            datetime.fromisoformat(HANDOFFS[i + 1][0]),
            f"{name} on call (gpu-infra, {layer if layer == 'override' else 'layer ' + layer})",
            stamp,
        )
        for i, (local, name, layer) in enumerate(HANDOFFS[:-1])
    ]
    assert got == expected
    # Times travel as UTC, whatever zone the schedule has.
    assert all(event.decoded("DTSTART").tzinfo is not None for event in events)
    assert b"DTSTART:20261024T180000Z" in feed and b"DTEND:20261025T070000Z" in feed
    assert len({str(event["UID"]) for event in events}) == len(events)


def test_feed_clips_to_the_range_and_is_stable() -> None:
    s = example_schedule()
    start, end = datetime(2026, 10, 27, 10, tzinfo=UTC), datetime(2026, 10, 27, 14, tzinfo=UTC)
    stamp = datetime(2026, 10, 1, tzinfo=UTC)
    feed = render_ics(s, start, end, stamp)
    assert feed == render_ics(s, start, end, stamp)
    events = Calendar.from_ical(feed).walk("VEVENT")
    assert [(e.decoded("DTSTART"), e.decoded("DTEND")) for e in events] == [
        (start, datetime(2026, 10, 27, 11, tzinfo=UTC)),  # bob until carol's override at 12:00
        (datetime(2026, 10, 27, 11, tzinfo=UTC), end),
    ]


def test_an_empty_range_is_a_valid_calendar() -> None:
    s = example_schedule()
    feed = render_ics(
        s, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC), datetime.now(UTC)
    )
    calendar = Calendar.from_ical(feed)
    assert calendar.walk("VEVENT") == []
    # An empty or reversed range has no events either (not a zero-length one).
    at = datetime(2026, 10, 27, 13, tzinfo=UTC)
    for end in (at, at - timedelta(hours=1)):
        assert Calendar.from_ical(render_ics(s, at, end, at)).walk("VEVENT") == []
