"""Handoffs at local wall time across DST changes, both directions, in two zones.

The expected instants come from the rules, not from our code: the EU changes clocks at 01:00
UTC on the last Sunday of March (CET+1 -> CEST+2) and of October (back); the US at 02:00
local on the second Sunday of March (EST-5 -> EDT-4) and the first Sunday of November (back).
In 2026 that is 29 March and 25 October (Berlin), 8 March and 1 November (New York).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from oncall_helpers import schedule, utc

from trainsentry.oncall.schedule import entries_at, on_call, timeline, wall_to_instant


def starts(s, a: str, b: str) -> list[tuple[str, str]]:
    """(UTC start 'YYYY-MM-DDTHH:MM', primary) of each segment from a to b."""
    return [
        (seg.start.strftime("%Y-%m-%dT%H:%M"), seg.entries[0][0] if seg.entries else "-")
        for seg in timeline(s, utc(a), utc(b))
    ]


@pytest.mark.parametrize(
    ("zone", "first", "expected"),
    [
        # Monday 09:00 weekly. Berlin autumn: 09:00 CEST = 07:00Z, then 09:00 CET = 08:00Z.
        (
            "Europe/Berlin",
            "2026-10-19T09:00",
            ["2026-10-19T07:00", "2026-10-26T08:00", "2026-11-02T08:00"],
        ),
        # Berlin spring: 09:00 CET = 08:00Z, then 09:00 CEST = 07:00Z.
        (
            "Europe/Berlin",
            "2026-03-23T09:00",
            ["2026-03-23T08:00", "2026-03-30T07:00", "2026-04-06T07:00"],
        ),
        # New York spring: 09:00 EST = 14:00Z, then 09:00 EDT = 13:00Z.
        (
            "America/New_York",
            "2026-03-02T09:00",
            ["2026-03-02T14:00", "2026-03-09T13:00", "2026-03-16T13:00"],
        ),
        # New York autumn: 09:00 EDT = 13:00Z, then 09:00 EST = 14:00Z.
        (
            "America/New_York",
            "2026-10-26T09:00",
            ["2026-10-26T13:00", "2026-11-02T14:00", "2026-11-09T14:00"],
        ),
    ],
)
def test_weekly_handoff_stays_at_local_nine(zone: str, first: str, expected: list[str]) -> None:
    s = schedule(zone, [{"name": "p", "start": first, "shift": "1w", "members": ["alice", "bob"]}])
    got = starts(s, expected[0], (utc(expected[-1]) + timedelta(hours=1)).isoformat()[:16])
    assert got == list(zip(expected, ["alice", "bob", "alice"], strict=True))


@pytest.mark.parametrize(
    ("zone", "day", "lengths"),
    [
        # 12 h shifts at 09:00 and 21:00 local: the night that loses an hour lasts 11 h, the
        # one that gains an hour 13 h; all others 12 h.
        ("Europe/Berlin", "2026-03-28", [12, 11, 12, 12]),
        ("Europe/Berlin", "2026-10-24", [12, 13, 12, 12]),
        ("America/New_York", "2026-03-07", [12, 11, 12, 12]),
        ("America/New_York", "2026-10-31", [12, 13, 12, 12]),
    ],
)
def test_twelve_hour_shifts_across_the_change(zone: str, day: str, lengths: list[int]) -> None:
    s = schedule(
        zone, [{"name": "p", "start": f"{day}T09:00", "shift": "12h", "members": ["alice", "bob"]}]
    )
    t = wall_to_instant(s.layers[0].start_wall, s.tz)
    segments = timeline(s, t, t + timedelta(hours=sum(lengths)))
    assert [seg.end - seg.start for seg in segments] == [timedelta(hours=h) for h in lengths]
    assert [seg.start.astimezone(s.tz).strftime("%H:%M") for seg in segments] == [
        "09:00",
        "21:00",
        "09:00",
        "21:00",
    ]


@pytest.mark.parametrize(
    ("zone", "gap_day", "jump_utc"),
    [
        ("Europe/Berlin", "2026-03-29", "2026-03-29T01:00"),
        ("America/New_York", "2026-03-08", "2026-03-08T07:00"),
    ],
)
def test_handoff_in_the_spring_gap_happens_at_the_jump(
    zone: str, gap_day: str, jump_utc: str
) -> None:
    # Daily 02:30 handoffs from the day before: 02:30 does not exist on the day the clocks
    # jump from 02:00 to 03:00.
    day_before = (utc(jump_utc) - timedelta(days=1)).strftime("%Y-%m-%d")
    layer = {
        "name": "p",
        "start": f"{day_before}T02:30",
        "shift": "1d",
        "members": ["alice", "bob"],
    }
    s = schedule(zone, [layer])
    assert entries_at(s, utc(jump_utc) - timedelta(seconds=1)) == (("alice", "p"),)
    assert entries_at(s, utc(jump_utc)) == (("bob", "p"),)
    nxt = on_call(s, utc(jump_utc))[0].until
    assert nxt is not None and nxt.astimezone(s.tz).strftime("%H:%M") == "02:30"
    assert nxt - utc(jump_utc) == timedelta(hours=23, minutes=30)


@pytest.mark.parametrize(
    ("zone", "day", "first_utc", "second_utc"),
    [
        # 02:30 happens twice in Berlin on 25 Oct: 00:30Z (CEST) and 01:30Z (CET).
        ("Europe/Berlin", "2026-10-25", "2026-10-25T00:30", "2026-10-25T01:30"),
        # 01:30 happens twice in New York on 1 Nov: 05:30Z (EDT) and 06:30Z (EST).
        ("America/New_York", "2026-11-01", "2026-11-01T05:30", "2026-11-01T06:30"),
    ],
)
def test_handoff_in_the_autumn_repeat_happens_the_first_time(
    zone: str, day: str, first_utc: str, second_utc: str
) -> None:
    wall = utc(first_utc).astimezone(ZoneInfo(zone)).strftime("%H:%M")
    s = schedule(
        zone,
        [
            {"name": "p", "start": f"{day[:8]}01T00:00", "shift": "1w", "members": ["erin"]},
            {"name": "d", "start": f"{day}T{wall}", "shift": "1d", "members": ["alice", "bob"]},
        ],
    )
    assert entries_at(s, utc(first_utc) - timedelta(seconds=1))[0] == ("erin", "p")
    assert entries_at(s, utc(first_utc))[0] == ("alice", "d")
    # The second time the clock shows that wall time changes nothing.
    assert entries_at(s, utc(second_utc))[0] == ("alice", "d")
    assert on_call(s, utc(first_utc))[0].until == utc(first_utc) + timedelta(hours=25)


def test_wall_to_instant_against_the_rules() -> None:
    s = schedule(
        "Europe/Berlin",
        [{"name": "p", "start": "2026-01-01T00:00", "shift": "1d", "members": ["alice"]}],
    )
    cases = {
        "2026-03-29T01:59": "2026-03-29T00:59",
        "2026-03-29T02:00": "2026-03-29T01:00",  # does not exist: the jump
        "2026-03-29T02:59": "2026-03-29T01:00",
        "2026-03-29T03:00": "2026-03-29T01:00",
        "2026-10-25T02:00": "2026-10-25T00:00",  # exists twice: the first
        "2026-10-25T03:00": "2026-10-25T02:00",
    }
    for wall, instant in cases.items():
        assert wall_to_instant(datetime.fromisoformat(wall), s.tz) == utc(instant), wall
