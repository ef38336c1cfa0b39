"""Bad `oncall:` configuration: a config error that names the field, never a crash."""

from __future__ import annotations

import contextlib
import copy
from datetime import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsentry.oncall.config import OncallConfigError, parse_oncall


def valid() -> dict[str, Any]:
    return {
        "people": {"alice": {"phone": "+4915100000001"}, "bob": {}, "carol": {}},
        "schedules": {
            "s": {
                "timezone": "Europe/Berlin",
                "layers": [
                    {
                        "name": "primary",
                        "start": "2026-10-19T09:00",
                        "shift": "1w",
                        "members": ["alice", "bob"],
                    },
                    {
                        "name": "nights",
                        "start": "2026-10-19T20:00",
                        "shift": "1d",
                        "members": ["carol"],
                        "restrict": {"hours": "20:00-08:00"},
                    },
                ],
                "overrides": [
                    {"who": "carol", "start": "2026-10-27T12:00", "end": "2026-10-27T18:00"}
                ],
            }
        },
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    """valid() with the value at a dotted path (list indexes as numbers) replaced."""
    config = valid()
    *parents, last = path.split(".")
    node: Any = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return config


L0 = "schedules.s.layers.0"
L1 = "schedules.s.layers.1"
O0 = "schedules.s.overrides.0"

CASES = [
    (f"{L0}.members", ["alice", "zed"], "layers[0].members[1]: unknown person 'zed'"),
    (f"{O0}.who", "zed", "oncall.schedules.s.overrides[0].who: unknown person 'zed'"),
    ("schedules.s.timezone", "Europe/Nowhere", "oncall.schedules.s.timezone: unknown time zone"),
    ("schedules.s.timezone", "../../etc/passwd", "oncall.schedules.s.timezone: unknown time zone"),
    ("schedules.s.timezone", "localtime", "oncall.schedules.s.timezone: unknown time zone"),
    ("schedules.s.timezone", 5, "oncall.schedules.s.timezone: must be a non-empty string"),
    (f"{O0}.end", "2026-10-27T11:00", "oncall.schedules.s.overrides[0].end: is not after start"),
    (f"{O0}.end", "2026-10-27T12:00", "oncall.schedules.s.overrides[0].end: is not after start"),
    (f"{L0}.end", "2026-10-01T00:00", "oncall.schedules.s.layers[0].end: is not after start"),
    (f"{L0}.start", "next monday", "oncall.schedules.s.layers[0].start: not an ISO 8601"),
    (f"{L0}.start", "0001-01-01T00:00", "layers[0].start: must lie between the years 1900"),
    (f"{O0}.end", "9999-12-31T23:59", "overrides[0].end: must lie between the years 1900"),
    (f"{L0}.shift", "1y", "oncall.schedules.s.layers[0].shift: must be a number and a unit"),
    (f"{L0}.shift", "0h", "oncall.schedules.s.layers[0].shift: must be a number and a unit"),
    (f"{L0}.shift", "30m", "oncall.schedules.s.layers[0].shift: must be at least 1h"),
    (f"{L0}.shift", 7, "oncall.schedules.s.layers[0].shift: must be a number and a unit"),
    (f"{L0}.members", [], "oncall.schedules.s.layers[0].members: must be a non-empty list"),
    (f"{L0}.colour", "red", "oncall.schedules.s.layers[0].colour: unknown field"),
    (f"{L0}.name", "override", "oncall.schedules.s.layers[0].name: 'override' is reserved"),
    (f"{L1}.name", "primary", "oncall.schedules.s.layers[1].name: 'primary' is used twice"),
    (f"{L1}.restrict", {"hours": "20:00-20:00"}, "layers[1].restrict.hours[0]: is empty"),
    (f"{L1}.restrict", {"hours": "25:00-08:00"}, "layers[1].restrict.hours[0]: hours run 00-23"),
    (f"{L1}.restrict", {"hours": 1200}, "layers[1].restrict.hours[0]: must be 'HH:MM-HH:MM'"),
    (
        f"{L1}.restrict",
        {"hours": ["20:00-08:00", "06:00-09:00"]},
        "oncall.schedules.s.layers[1].restrict.hours[1]: overlaps hours[0] (20:00-08:00)",
    ),
    (f"{L1}.restrict", {"hours": ["22:00-24:00", "23:00-01:00"]}, "hours[1]: overlaps hours[0]"),
    (f"{L1}.restrict", {"hours": []}, "layers[1].restrict.hours: must name at least one range"),
    (
        "schedules.s.overrides",
        [
            {"who": "carol", "start": "2026-10-27T12:00", "end": "2026-10-27T18:00"},
            {"who": "alice", "start": "2026-10-27T17:59", "end": "2026-10-27T19:00"},
        ],
        "oncall.schedules.s.overrides[1]: overlaps overrides[0]",
    ),
    ("people.alice.phone", "0151 000", "oncall.people.alice.phone: must be in international form"),
    ("people.alice.pager", "x", "oncall.people.alice.pager: unknown field"),
    ("people", ["alice"], "oncall.people: must map names to contact details"),
    ("schedules", {}, "oncall.schedules: must map schedule names to schedules"),
    ("schedules.s.layers", "primary", "oncall.schedules.s.layers: must be a non-empty list"),
    ("schedules.s.timezone", None, "oncall.schedules.s.timezone: must be a non-empty string"),
]


@pytest.mark.parametrize(("path", "value", "message"), CASES)
def test_bad_input_names_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(OncallConfigError) as caught:
        parse_oncall(with_change(path, value))
    assert message in str(caught.value)


def test_the_valid_config_is_valid_and_touching_layers_are_fine() -> None:
    config = parse_oncall(valid())
    assert [layer.name for layer in config.schedules["s"].layers] == ["primary", "nights"]
    # Ranges that only touch do not overlap; overrides that only touch neither.
    touching = with_change(f"{L1}.restrict", {"hours": ["20:00-24:00", "00:00-08:00"]})
    touching["schedules"]["s"]["overrides"].append(
        {"who": "alice", "start": "2026-10-27T18:00", "end": "2026-10-27T19:00"}
    )
    ranges = parse_oncall(touching).schedules["s"].layers[1].restrict
    assert ranges is not None and ranges.ranges[1].start == time(0)


def test_all_problems_are_reported_at_once() -> None:
    config = with_change("schedules.s.timezone", "Nowhere")
    config["schedules"]["t"] = copy.deepcopy(config["schedules"]["s"])
    config["schedules"]["t"]["timezone"] = "UTC"
    config["schedules"]["t"]["layers"][0]["members"] = ["zed"]
    with pytest.raises(OncallConfigError) as caught:
        parse_oncall(config)
    assert "oncall.schedules.s.timezone" in str(caught.value)
    assert "oncall.schedules.t.layers[0].members[0]" in str(caught.value)


def test_a_person_name_that_is_not_text_is_refused() -> None:
    config = valid()
    config["people"][5] = {}
    with pytest.raises(OncallConfigError, match=r"oncall.people.5: must be 1-63"):
        parse_oncall(config)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["1w", "12h", "20:00-08:00", "2026-10-19T09:00", "Europe/Berlin", "alice"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_paths = st.sampled_from(
    [path for path, _, _ in CASES] + ["schedules.s", "schedules.s.layers.0", "people.bob", L1, O0]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=_paths, value=_json)
def test_any_value_anywhere_is_a_config_error_or_valid(path: str, value: Any) -> None:
    with contextlib.suppress(OncallConfigError):
        parse_oncall(with_change(path, value))


@settings(max_examples=100, deadline=None)
@given(value=_json)
def test_any_section_is_a_config_error_or_valid(value: Any) -> None:
    with contextlib.suppress(OncallConfigError):
        parse_oncall(value)
