"""Overrides inside and across handoffs, restrictions over midnight, precedence, `until`."""

from __future__ import annotations

from datetime import timedelta

from oncall_helpers import schedule, utc

from trainsentry.oncall.schedule import entries_at, on_call

# Everything in UTC so the expectations read plainly; DST is test_dst.py's business.
WEEKLY = {
    "name": "primary",
    "start": "2026-06-01T09:00",
    "shift": "1w",
    "members": ["alice", "bob"],
}
NIGHTS = {
    "name": "nights",
    "start": "2026-06-01T20:00",
    "shift": "1d",
    "members": ["dave", "erin"],
    "restrict": {"hours": "20:00-08:00"},
}


def answer(s, at: str) -> list[tuple[str, str, str | None]]:
    return [
        (p.name, p.layer, p.until.strftime("%Y-%m-%dT%H:%M") if p.until else None)
        for p in on_call(s, utc(at))
    ]


def test_override_inside_a_shift_then_the_rotation_resumes() -> None:
    s = schedule(
        "UTC", [WEEKLY], [{"who": "carol", "start": "2026-06-03T12:00", "end": "2026-06-03T18:00"}]
    )
    assert answer(s, "2026-06-03T11:59") == [("alice", "primary", "2026-06-03T12:00")]
    assert answer(s, "2026-06-03T12:00") == [
        ("carol", "override", "2026-06-03T18:00"),
        ("alice", "primary", "2026-06-08T09:00"),  # still on call, behind carol
    ]
    assert answer(s, "2026-06-03T18:00") == [("alice", "primary", "2026-06-08T09:00")]


def test_override_across_a_handoff_hands_back_to_the_next_person() -> None:
    s = schedule(
        "UTC", [WEEKLY], [{"who": "carol", "start": "2026-06-08T06:00", "end": "2026-06-08T12:00"}]
    )
    assert answer(s, "2026-06-08T08:59") == [
        ("carol", "override", "2026-06-08T12:00"),
        ("alice", "primary", "2026-06-08T09:00"),
    ]
    assert answer(s, "2026-06-08T09:00") == [
        ("carol", "override", "2026-06-08T12:00"),
        ("bob", "primary", "2026-06-15T09:00"),
    ]
    assert answer(s, "2026-06-08T12:00") == [("bob", "primary", "2026-06-15T09:00")]


def test_override_by_the_person_on_call_shows_them_once() -> None:
    s = schedule(
        "UTC", [WEEKLY], [{"who": "alice", "start": "2026-06-02T00:00", "end": "2026-06-10T00:00"}]
    )
    # alice's own week: listed once, through the override.
    assert answer(s, "2026-06-03T00:00") == [("alice", "override", "2026-06-10T00:00")]
    # bob's week, alice still covering: bob follows her.
    assert answer(s, "2026-06-09T00:00") == [
        ("alice", "override", "2026-06-10T00:00"),
        ("bob", "primary", "2026-06-15T09:00"),
    ]


def test_restriction_over_midnight() -> None:
    s = schedule("UTC", [WEEKLY, NIGHTS])
    assert entries_at(s, utc("2026-06-02T19:59")) == (("alice", "primary"),)
    assert entries_at(s, utc("2026-06-02T20:00")) == (("erin", "nights"), ("alice", "primary"))
    # After midnight the night still belongs to the shift that began at 20:00.
    assert entries_at(s, utc("2026-06-03T03:00")) == (("erin", "nights"), ("alice", "primary"))
    assert entries_at(s, utc("2026-06-03T07:59")) == (("erin", "nights"), ("alice", "primary"))
    assert entries_at(s, utc("2026-06-03T08:00")) == (("alice", "primary"),)
    assert answer(s, "2026-06-03T03:00") == [
        ("erin", "nights", "2026-06-03T08:00"),
        ("alice", "primary", "2026-06-08T09:00"),
    ]
    # The very first night begins at the layer's start, not before.
    assert entries_at(s, utc("2026-06-01T07:00")) == ()


def test_restriction_with_several_ranges_and_up_to_midnight() -> None:
    layer = {
        "name": "office",
        "start": "2026-06-01T00:00",
        "shift": "1d",
        "members": ["carol"],
        "restrict": {"hours": ["09:00-12:00", "13:00-24:00"]},
    }
    s = schedule("UTC", [layer])
    covered = [h for h in range(24) if entries_at(s, utc(f"2026-06-02T{h:02d}:30"))]
    assert covered == [9, 10, 11, *range(13, 24)]
    assert answer(s, "2026-06-02T23:30") == [("carol", "office", "2026-06-03T00:00")]


def test_restriction_over_midnight_across_dst_night() -> None:
    # Berlin, night of 24/25 Oct 2026: 20:00 CEST (18:00Z) to 08:00 CET (07:00Z), 13 hours.
    s = schedule("Europe/Berlin", [{**NIGHTS, "start": "2026-10-19T20:00"}])
    assert entries_at(s, utc("2026-10-24T17:59")) == ()
    assert answer(s, "2026-10-24T18:00") == [("erin", "nights", "2026-10-25T07:00")]
    assert entries_at(s, utc("2026-10-25T06:59")) == (("erin", "nights"),)
    assert entries_at(s, utc("2026-10-25T07:00")) == ()


def test_later_layer_wins_and_earlier_layers_follow() -> None:
    s = schedule("UTC", [WEEKLY, NIGHTS, {**WEEKLY, "name": "lead", "members": ["frank"]}])
    assert [e[0] for e in entries_at(s, utc("2026-06-02T22:00"))] == ["frank", "erin", "alice"]


def test_layer_end_and_until_when_nothing_changes() -> None:
    ends = {**WEEKLY, "members": ["alice"], "end": "2026-06-20T00:00"}
    assert answer(schedule("UTC", [ends]), "2026-06-02T00:00") == [
        ("alice", "primary", "2026-06-20T00:00")
    ]
    forever = {**WEEKLY, "members": ["alice"]}
    assert answer(schedule("UTC", [forever]), "2026-06-02T00:00") == [("alice", "primary", None)]


def test_until_is_the_next_change_not_the_next_boundary() -> None:
    # alice twice in a row: the handoff between her two shifts changes nothing.
    s = schedule("UTC", [{**WEEKLY, "members": ["alice", "alice", "bob"]}])
    assert answer(s, "2026-06-02T00:00") == [("alice", "primary", "2026-06-15T09:00")]
    assert on_call(s, utc("2026-06-02T00:00"), horizon=timedelta(days=3))[0].until is None


def test_a_start_with_an_offset_is_converted_to_local_wall_time() -> None:
    # 07:00Z is 09:00 in Berlin in June; handoffs then stay at 09:00 local.
    s = schedule("Europe/Berlin", [{**WEEKLY, "start": "2026-06-01T07:00:00+00:00"}])
    assert answer(s, "2026-06-01T07:00") == [("alice", "primary", "2026-06-08T07:00")]
    assert answer(s, "2026-11-09T08:00")[0][:2] == ("bob", "primary")  # 09:00 CET, 23 weeks on
    assert entries_at(s, utc("2026-11-09T07:59"))[0][0] == "alice"
