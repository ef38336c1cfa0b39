"""Maintenance windows: parsing (field-named errors) and pure matching at an instant.

Labels as Alertmanager sends them (label names from rules/: alertname, priority, node,
namespace). Recurring times checked against the EU DST rule: Berlin is +02:00 until the last
Sunday of October 2026 (the 25th), +01:00 after.
"""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oncall.oncall_helpers import utc
from trainsentry.maintenance.match import active_span, muted_by, rule_of
from trainsentry.maintenance.windows import parse_window
from trainsentry.oncall.config import OncallConfigError, parse_oncall

CREATED = datetime(2026, 10, 15, 9, 30, tzinfo=UTC)
YEAR = timedelta(days=366)
P0 = {"alertname": "KubeNodeNotReady", "priority": "P0", "namespace": "team-a"}


def window(body: dict[str, Any], **kwargs: Any):  # type: ignore[no-untyped-def]
    kwargs.setdefault("max_total", YEAR)  # the cap in all has tests of its own
    return parse_window(body, window_id=kwargs.pop("window_id", "w1"), created_at=CREATED, **kwargs)


ONE_OFF = {
    "matchers": {"node": "gpu-node-17"},
    "starts_at": "2026-10-27T01:00:00Z",
    "ends_at": "2026-10-27T05:00:00+01:00",  # 04:00Z
    "reason": "NVLink replacement",
    "created_by": "alice",
}
TUESDAYS = {
    "matchers": {"node": {"regex": "gpu-node-1[0-9]"}},
    "rrule": "FREQ=WEEKLY;BYDAY=TU;UNTIL=20261231T000000",
    "start": "02:00",
    "duration_minutes": 120,
    "timezone": "Europe/Berlin",
}


def test_one_node_muted_the_same_alert_on_another_node_not() -> None:
    w = window(ONE_OFF)
    at = utc("2026-10-27T02:00")
    assert muted_by([w], {**P0, "node": "gpu-node-17"}, at) is w
    assert muted_by([w], {**P0, "node": "gpu-node-18"}, at) is None
    assert muted_by([w], {**P0, "node": "gpu-node-170"}, at) is None  # equality, not prefix
    assert muted_by([w], P0, at) is None  # no node label: the empty string
    # From starts_at (included) to ends_at (excluded).
    assert muted_by([w], {**P0, "node": "gpu-node-17"}, utc("2026-10-27T00:59")) is None
    assert muted_by([w], {**P0, "node": "gpu-node-17"}, utc("2026-10-27T01:00")) is w
    assert muted_by([w], {**P0, "node": "gpu-node-17"}, utc("2026-10-27T04:00")) is None
    assert (w.reason, w.created_by) == ("NVLink replacement", "alice")


def test_every_matcher_must_hold_and_regex_is_anchored() -> None:
    w = window({**TUESDAYS, "matchers": {"node": {"regex": "gpu-node-1[0-9]"}, "priority": "P0"}})
    at = utc("2026-10-20T01:00")  # Tuesday 03:00 CEST
    assert muted_by([w], {**P0, "node": "gpu-node-17"}, at) is w
    assert muted_by([w], {**P0, "node": "gpu-node-17", "priority": "P1"}, at) is None
    assert muted_by([w], {**P0, "node": "gpu-node-170"}, at) is None
    assert muted_by([w], {**P0, "node": "xgpu-node-17"}, at) is None


@pytest.mark.parametrize(
    ("at", "span"),
    [
        # Tuesday 20 Oct, CEST: 02:00-04:00 local = 00:00-02:00Z.
        ("2026-10-19T23:59", None),
        ("2026-10-20T00:00", ("2026-10-20T00:00", "2026-10-20T02:00")),
        ("2026-10-20T01:59", ("2026-10-20T00:00", "2026-10-20T02:00")),
        ("2026-10-20T02:00", None),
        # Tuesday 27 Oct, CET after the change: 02:00 local = 01:00Z.
        ("2026-10-27T00:30", None),
        ("2026-10-27T01:00", ("2026-10-27T01:00", "2026-10-27T03:00")),
        ("2026-10-27T02:59", ("2026-10-27T01:00", "2026-10-27T03:00")),
        ("2026-10-27T03:00", None),
        ("2026-10-21T01:00", None),  # a Wednesday
        ("2026-10-13T01:00", None),  # before the window was made (since = creation day)
    ],
)
def test_recurring_window_at_local_wall_time_across_dst(
    at: str, span: tuple[str, str] | None
) -> None:
    w = window(TUESDAYS)
    got = active_span(w, utc(at))
    assert got == (None if span is None else (utc(span[0]), utc(span[1])))
    assert (muted_by([w], {**P0, "node": "gpu-node-12"}, utc(at)) is w) == (span is not None)


def test_recurring_occurrence_in_the_spring_gap_starts_at_the_jump() -> None:
    # Sunday 29 March 2026 02:30 does not exist in Berlin; the window opens at the jump
    # (01:00Z) and lasts its 60 real minutes.
    w = window({**TUESDAYS, "rrule": "FREQ=WEEKLY;BYDAY=SU;COUNT=8", "start": "02:30",
                "duration_minutes": 60, "since": "2026-03-01"})  # fmt: skip
    assert active_span(w, utc("2026-03-29T01:30")) == (
        utc("2026-03-29T01:00"),
        utc("2026-03-29T02:00"),
    )


def test_the_first_matching_window_is_named() -> None:
    first = window(ONE_OFF, window_id="a")
    second = window({**ONE_OFF, "matchers": {"alertname": {"regex": "Kube.*"}}}, window_id="b")
    labels = {**P0, "node": "gpu-node-17"}
    assert muted_by([second, first], labels, utc("2026-10-27T02:00")) is second
    assert muted_by([first, second], labels, utc("2026-10-27T02:00")) is first


BAD = [
    ({**TUESDAYS, "rrule": "FREQ=WEEKLY;COUNT=0"}, "window.rrule: never fires"),
    ({**TUESDAYS, "rrule": "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30"}, "rrule: BYMONTHDAY never"),
    ({**TUESDAYS, "rrule": "FREQ=DAILY;UNTIL=20260101T000000"}, "window.rrule: never fires"),
    ({**TUESDAYS, "rrule": "FREQ=DAILY;BYSETPOS=5"}, "window.rrule: BYSETPOS is not supported"),
    ({**TUESDAYS, "rrule": "FREQ=DAILY;BYMONTH=2,4;BYMONTHDAY=31,-31"}, "rrule: BYMONTHDAY never"),
    ({**TUESDAYS, "rrule": "FREQ=DAILY;INTERVAL=7;BYDAY=TU"}, "rrule: a DAILY rule with an"),
    ({**TUESDAYS, "rrule": "FREQ=MONTHLY;BYDAY=6MO"}, "rrule: BYDAY '6MO': the number"),
    ({**TUESDAYS, "rrule": "FREQ=MONTHLY;INTERVAL=12;BYMONTH=3;COUNT=2"}, "rrule: never fires"),
    ({**TUESDAYS, "rrule": "FREQ=WEEKLY;BYDAY=XX;COUNT=2"}, "window.rrule: not an RRULE"),
    ({**TUESDAYS, "rrule": "every tuesday"}, "window.rrule: not an RRULE"),
    ({**TUESDAYS, "rrule": "FREQ=MINUTELY"}, "window.rrule: FREQ must be DAILY"),
    ({**TUESDAYS, "rrule": "DTSTART:20200101T000000\nRRULE:FREQ=DAILY"}, "window.rrule: give one"),
    ({**TUESDAYS, "timezone": "Europe/Nowhere"}, "window.timezone: unknown time zone"),
    ({**TUESDAYS, "start": "2am"}, "window.start: must be a local time"),
    ({**TUESDAYS, "duration_minutes": 0}, "window.duration_minutes: must be a whole number"),
    ({**TUESDAYS, "duration_minutes": 24 * 60 * 8}, "window.duration_minutes: longer than the cap"),
    ({**ONE_OFF, "ends_at": "2026-10-27T00:00:00Z"}, "window.ends_at: is not after starts_at"),
    ({**ONE_OFF, "ends_at": "2026-11-27T00:00:00Z"}, "window.ends_at: the window is longer"),
    ({**ONE_OFF, "starts_at": "2026-10-27T01:00"}, "window.starts_at: needs a UTC offset"),
    ({**ONE_OFF, "starts_at": "soon"}, "window.starts_at: not an ISO 8601"),
    ({"matchers": {"node": "n"}, "starts_at": "2026-10-27T01:00Z"}, "window.ends_at: is required"),
    ({**ONE_OFF, "matchers": {}}, "window.matchers: must map at least one label"),
    ({**ONE_OFF, "matchers": {"node": {"regex": "gpu-node-("}}}, "matchers.node.regex: not a"),
    ({**ONE_OFF, "matchers": {"node-name": "x"}}, "window.matchers.node-name: is not a label name"),
    ({**ONE_OFF, "matchers": {"node": 17}}, "window.matchers.node: must be a mapping"),
    ({**ONE_OFF, **TUESDAYS}, "window: give starts_at/ends_at or rrule"),
    ({**ONE_OFF, "colour": "red"}, "window.colour: unknown field"),
    ({**ONE_OFF, "reason": 5}, "window.reason: must be a string"),
    # issue 32 finding 5: windows that mute every alert, or never end
    ({**TUESDAYS, "rrule": "FREQ=WEEKLY;BYDAY=TU"}, "window.rrule: needs COUNT or UNTIL"),
    ({**ONE_OFF, "matchers": {"alertname": {"regex": ".*"}}}, "window.matchers: every matcher"),
    ({**ONE_OFF, "matchers": {"nosuchlabel": ""}}, "window.matchers: every matcher matches"),
    ({**ONE_OFF, "matchers": {"node": {"regex": "|x"}}}, "window.matchers: every matcher"),
    # RE2 (Alertmanager's syntax): no look-around
    (
        {**ONE_OFF, "matchers": {"node": {"regex": "(?=gpu)gpu-1"}}},
        "matchers.node.regex: not a regular expression (RE2 syntax)",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_window_names_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(OncallConfigError) as caught:
        window(body)
    assert message in str(caught.value)


def test_the_cap_is_a_parameter() -> None:
    cap = timedelta(hours=1)
    with pytest.raises(OncallConfigError, match="duration_minutes: longer than the cap"):
        window(TUESDAYS, max_window=cap)
    assert window({**TUESDAYS, "duration_minutes": 60}, max_window=cap)


def test_the_cap_in_all_counts_real_time_across_a_dst_change() -> None:
    # Tuesdays 02:00 in Berlin for 60 minutes, twice: 20 Oct 00:00Z (CEST) and 27 Oct 01:00Z
    # (CET). First start to last end: 7 days 2 hours of real time, 7 days 1 hour on the wall.
    body = {**TUESDAYS, "rrule": "FREQ=WEEKLY;BYDAY=TU;COUNT=2", "duration_minutes": 60}
    with pytest.raises(OncallConfigError, match=r"window\.rrule: the occurrences last longer"):
        window(body, max_total=timedelta(days=7, hours=1, minutes=30))
    assert window(body, max_total=timedelta(days=7, hours=2))
    until = {**body, "rrule": "FREQ=WEEKLY;BYDAY=TU;UNTIL=20261027T020000"}
    with pytest.raises(OncallConfigError, match=r"window\.rrule: the occurrences last longer"):
        window(until, max_total=timedelta(days=7, hours=1, minutes=30))
    assert window(until, max_total=timedelta(days=7, hours=2))
    # the default cap in all is the default cap of one window (168 hours)
    with pytest.raises(OncallConfigError, match="last longer than the cap in all"):
        parse_window(body, window_id="w", created_at=CREATED)
    # a stored window is read again without the caps (max_total=None)
    endless_count = {**body, "rrule": "FREQ=DAILY;COUNT=1000"}
    assert window(endless_count, max_total=None).recurring is not None


def test_empty_matchers_are_allowed_beside_one_that_needs_a_value() -> None:
    w = window({**ONE_OFF, "matchers": {"node": "gpu-node-17", "team": ""}})
    at = utc("2026-10-27T02:00")
    assert muted_by([w], {**P0, "node": "gpu-node-17"}, at) is w
    assert muted_by([w], {**P0, "node": "gpu-node-17", "team": "a"}, at) is None
    assert muted_by([w], P0, at) is None


def test_a_backtracking_regex_and_a_crafted_label_take_no_time() -> None:
    w = window({**ONE_OFF, "matchers": {"node": {"regex": "(a+)+"}}})
    at = utc("2026-10-27T02:00")
    started = time.perf_counter()
    assert muted_by([w], {**P0, "node": "a" * 28 + "!"}, at) is None  # re: 13-31 s
    assert time.perf_counter() - started < 0.5
    assert muted_by([w], {**P0, "node": "aaaa"}, at) is w


def test_the_oncall_section_has_no_window_cap_of_its_own() -> None:
    """The gateway's cap is its top-level `maintenance.max_window_hours`; a second one in
    `oncall:` would be read by nothing."""
    with pytest.raises(OncallConfigError, match="maintenance"):
        parse_oncall({"maintenance": {"max_window_hours": 1}, "schedules": {"s": {
            "timezone": "UTC", "layers": [{"name": "p", "start": "2026-01-01T00:00",
                                           "shift": "1w", "members": ["a"]}]}},
                      "people": {"a": {}}})  # fmt: skip


def test_local_one_off_times_with_a_timezone() -> None:
    w = window({**ONE_OFF, "starts_at": "2026-10-25T02:30", "ends_at": "2026-10-25T04:00",
                "timezone": "Europe/Berlin"})  # fmt: skip
    # 02:30 happens twice that night: the first time (00:30Z); 04:00 CET is 03:00Z.
    assert (w.starts_at, w.ends_at) == (utc("2026-10-25T00:30"), utc("2026-10-25T03:00"))


def test_dateutil_keeps_count_and_until_where_first_occurrence_reads_them() -> None:
    rule = rule_of(window({**TUESDAYS, "rrule": "FREQ=WEEKLY;COUNT=3;BYDAY=TU"}).recurring)  # type: ignore[arg-type]
    assert getattr(rule, "_count", None) == 3
    rule = rule_of(window({**TUESDAYS, "rrule": "FREQ=WEEKLY;UNTIL=20270101T000000"}).recurring)  # type: ignore[arg-type]
    assert getattr(rule, "_until", None) == datetime(2027, 1, 1)


_values = (
    st.none()
    | st.integers()
    | st.text(max_size=30)
    | st.sampled_from(
        ["FREQ=DAILY", "FREQ=WEEKLY;BYDAY=TU", "02:00", "Europe/Berlin", "2026-10-27T01:00:00Z"]
    )
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted({*TUESDAYS, *ONE_OFF, "since", "timezone"})), value=_values,
       base=st.sampled_from([ONE_OFF, TUESDAYS]))  # fmt: skip
def test_any_value_is_a_window_or_a_field_error(key: str, value: Any, base: dict[str, Any]) -> None:
    with contextlib.suppress(OncallConfigError):
        window({**base, key: value})
