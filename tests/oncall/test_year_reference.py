"""A year of schedule answers, minute by minute, against an independent brute-force reference.

The reference does not use trainsentry's math. It watches the local wall clock minute by
minute and keeps the latest time the clock has shown (`shown`); an event at wall time W has
happened once `shown` >= W (docs/oncall.md: "at the first instant the clock shows W or
later"). From that alone it counts handoffs, opens and closes restrictions and overrides.
Layers, overrides and hours are read from the same raw configuration, by its own code.
Besides the fixed year, random schedules (hypothesis) are checked for four days around a
clock change in zones with a 30-minute change (Lord Howe), a change at midnight (Santiago)
and none (Kolkata).
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, datetime, time, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oncall_helpers import schedule

from trainsentry.oncall.schedule import on_call, timeline


def shift_of(text: str) -> timedelta:
    unit = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}[text[-1]]
    return int(text[:-1]) * unit


def layers(odd_start: str, odd_hours: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "primary",
            "start": "2026-01-05T09:00",
            "shift": "1w",
            "members": ["alice", "bob", "carol"],
        },
        {
            "name": "nights",
            "start": "2026-01-05T20:00",
            "shift": "1d",
            "members": ["dave", "erin"],
            "restrict": {"hours": "20:00-08:00"},
        },
        # Handoffs and hours inside the times the clocks skip or repeat.
        {
            "name": "odd",
            "start": odd_start,
            "shift": "12h",
            "members": ["frank", "carol"],
            "restrict": {"hours": odd_hours},
            "end": "2026-12-20T00:00",
        },
    ]


CASES = {
    "Europe/Berlin": (
        layers("2026-03-28T02:30", "02:00-03:30"),
        [
            {"who": "erin", "start": "2026-03-28T22:00", "end": "2026-03-29T04:00"},
            {"who": "bob", "start": "2026-10-25T01:00", "end": "2026-10-25T02:30"},
            {"who": "frank", "start": "2026-07-06T08:30", "end": "2026-07-06T09:30"},
        ],
    ),
    "America/New_York": (
        layers("2026-03-07T02:30", "01:30-02:30"),
        [
            {"who": "erin", "start": "2026-03-07T22:00", "end": "2026-03-08T04:00"},
            {"who": "bob", "start": "2026-11-01T00:30", "end": "2026-11-01T01:30"},
            {"who": "frank", "start": "2026-07-06T08:30", "end": "2026-07-06T09:30"},
        ],
    ),
}


def reference(
    zone: str,
    raw_layers: list[dict[str, Any]],
    raw_overrides: list[dict[str, str]],
    start: datetime,
    minutes: int,
) -> list[tuple[tuple[str, str], ...]]:
    tz = ZoneInfo(zone)
    wall = datetime.fromisoformat
    parsed = []
    for layer in raw_layers:
        ranges = []
        if "restrict" in layer:
            begin, _, end = layer["restrict"]["hours"].partition("-")
            ranges.append((time.fromisoformat(begin), time.fromisoformat(end)))
        parsed.append(
            (
                layer["name"],
                wall(layer["start"]),
                shift_of(layer["shift"]),
                layer["members"],
                ranges,
                wall(layer["end"]) if "end" in layer else None,
            )
        )
    overrides = [(o["who"], wall(o["start"]), wall(o["end"])) for o in raw_overrides]
    out = []
    shown = datetime.min
    for i in range(minutes):
        shown = max(shown, (start + timedelta(minutes=i)).astimezone(tz).replace(tzinfo=None))
        entries: list[tuple[str, str]] = []
        for who, begin, end in overrides:
            if begin <= shown < end:
                entries.append((who, "override"))
        for name, first, shift, members, ranges, until in reversed(parsed):
            if shown < first or (until is not None and shown >= until):
                continue
            if ranges:
                inside = False
                for day in (shown.date() - timedelta(days=1), shown.date()):
                    for begin, end in ranges:
                        opens = datetime.combine(day, begin)
                        closes = datetime.combine(
                            day + timedelta(days=1) if end <= begin else day, end
                        )
                        inside = inside or opens <= shown < closes
                if not inside:
                    continue
            who = members[((shown - first) // shift) % len(members)]
            if who not in [e[0] for e in entries]:
                entries.append((who, name))
        out.append(tuple(entries))
    return out


@pytest.mark.parametrize("zone", sorted(CASES))
def test_a_year_minute_by_minute(zone: str) -> None:
    raw_layers, raw_overrides = CASES[zone]
    s = schedule(zone, raw_layers, raw_overrides)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    minutes = 365 * 24 * 60
    expected = reference(zone, raw_layers, raw_overrides, start, minutes)

    segments = timeline(s, start, start + timedelta(minutes=minutes))
    starts = [seg.start for seg in segments]
    mismatches = []
    for i in range(minutes):
        t = start + timedelta(minutes=i)
        got = segments[bisect_right(starts, t) - 1].entries
        if got != expected[i]:
            mismatches.append((t.isoformat(), got, expected[i]))
    assert mismatches[:5] == []

    # Handoffs of the person paged: the same instants, and plenty of them (DST days included).
    ref_handoffs = [
        start + timedelta(minutes=i)
        for i in range(1, minutes)
        if expected[i][:1] != expected[i - 1][:1]
    ]
    got_handoffs = [b.start for a, b in pairwise(segments) if a.entries[:1] != b.entries[:1]]
    assert got_handoffs == ref_handoffs
    assert len(ref_handoffs) > 700
    tz = ZoneInfo(zone)
    offsets = {t.astimezone(tz).utcoffset() for t in ref_handoffs}
    assert len(offsets) == 2  # handoffs under both offsets of the year

    # `until` of the person paged = the reference's next change, sampled through the year.
    for i in range(0, minutes, 997):
        t = start + timedelta(minutes=i)
        nxt = bisect_right(ref_handoffs, t)
        answer = on_call(s, t)
        if not expected[i] or nxt == len(ref_handoffs):
            continue
        assert (answer[0].name, answer[0].layer) == expected[i][0]
        assert answer[0].until == ref_handoffs[nxt], t


# Zones: two DST directions, a 30-minute DST (Lord Howe), none (Kolkata), southern (Santiago).
ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Santiago",
]
# A day with a clock change in each (2026), the random layers start around it.
CHANGE_DAYS = {"Europe/Berlin": "2026-10-24", "America/New_York": "2026-03-07",
               "Australia/Lord_Howe": "2026-04-04", "Asia/Kolkata": "2026-03-28",
               "America/Santiago": "2026-04-04"}  # fmt: skip
_clock = st.tuples(st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))


@st.composite
def random_schedule(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]], list[dict[str, str]]]:
    zone = draw(st.sampled_from(ZONES))
    day = datetime.fromisoformat(CHANGE_DAYS[zone])
    raw_layers = []
    for i in range(draw(st.integers(1, 3))):
        hour, minute = draw(_clock)
        start = day + timedelta(days=draw(st.integers(-2, 1)), hours=hour, minutes=minute)
        layer: dict[str, Any] = {
            "name": f"l{i}",
            "start": start.isoformat(),
            "shift": draw(st.sampled_from(["1h", "3h", "12h", "1d", "2d", "1w"])),
            "members": draw(
                st.lists(st.sampled_from(["alice", "bob", "carol", "dave"]), min_size=1, max_size=3)
            ),
        }
        if draw(st.booleans()):
            (h1, m1), (h2, m2) = draw(_clock), draw(_clock)
            if (h1, m1) != (h2, m2):
                layer["restrict"] = {"hours": f"{h1:02d}:{m1:02d}-{h2:02d}:{m2:02d}"}
        raw_layers.append(layer)
    overrides = []
    if draw(st.booleans()):
        hour, minute = draw(_clock)
        begin = day + timedelta(hours=hour, minutes=minute)
        length = timedelta(minutes=15 * draw(st.integers(1, 12 * 4)))
        overrides.append(
            {"who": "erin", "start": begin.isoformat(), "end": (begin + length).isoformat()}
        )
    return zone, raw_layers, overrides


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_schedule())
def test_random_schedules_around_a_clock_change(
    case: tuple[str, list[dict[str, Any]], list[dict[str, str]]],
) -> None:
    zone, raw_layers, raw_overrides = case
    s = schedule(zone, raw_layers, raw_overrides)
    start = datetime.fromisoformat(CHANGE_DAYS[zone]).replace(tzinfo=UTC) - timedelta(days=1)
    minutes = 4 * 24 * 60
    expected = reference(zone, raw_layers, raw_overrides, start, minutes)
    segments = timeline(s, start, start + timedelta(minutes=minutes))
    starts = [seg.start for seg in segments]
    for i in range(minutes):
        t = start + timedelta(minutes=i)
        assert segments[bisect_right(starts, t) - 1].entries == expected[i], t.isoformat()
