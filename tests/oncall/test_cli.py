"""`trainsentry oncall now`, run as a real process, on the issue's example (example.yaml):
right at every handoff from 19 October to 2 November 2026, across the DST change of 25
October (oncall_helpers.HANDOFFS, worked out by hand)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from oncall_helpers import EXAMPLE, HANDOFFS, run_cli

SECOND_SCHEDULE = """\
    b:
      timezone: UTC
      layers: [{name: p, start: "2026-01-05T09:00", shift: 1w, members: [alice]}]
"""


def now_json(at: str) -> dict[str, object]:
    code, out, err = run_cli("now", "--config", str(EXAMPLE), "--at", at, "--json")
    assert code == 0, err
    answer: dict[str, object] = json.loads(out)
    return answer


def test_right_at_every_handoff_across_the_october_change() -> None:
    # Asked in UTC (`Z`), answered in Berlin time: the conversion is part of what is tested.
    ats = [datetime.fromisoformat(local).astimezone(UTC) for local, _, _ in HANDOFFS]
    queries = [at.strftime("%Y-%m-%dT%H:%M:%SZ") for at in ats]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(now_json, queries))
        before = list(
            pool.map(now_json, [(at - timedelta(seconds=1)).isoformat() for at in ats[1:]])
        )
    for i, (local, name, layer) in enumerate(HANDOFFS):
        answer = answers[i]
        assert answer["schedule"] == "gpu-infra"
        assert answer["at"] == local
        first = answer["on_call"][0]  # type: ignore[index]
        assert (first["name"], first["layer"]) == (name, layer), local
        if i + 1 < len(HANDOFFS):
            assert first["until"] == HANDOFFS[i + 1][0], local
            # One second before the next handoff nothing has changed yet.
            assert before[i]["on_call"][0]["name"] == name, local  # type: ignore[index]


def test_whole_answer_shape_with_backups() -> None:
    answer = now_json("2026-10-27T13:00")  # no offset: Berlin time
    assert answer == {
        "schedule": "gpu-infra",
        "at": "2026-10-27T13:00:00+01:00",
        "on_call": [
            {"name": "carol", "layer": "override", "until": "2026-10-27T18:00:00+01:00"},
            {"name": "bob", "layer": "primary", "until": "2026-11-02T09:00:00+01:00"},
        ],
    }


def test_text_output(tmp_path: Path) -> None:
    code, out, _ = run_cli("now", "--config", str(EXAMPLE), "--at", "2026-10-25T02:30+01:00")
    assert code == 0
    assert out.splitlines() == [
        "gpu-infra at 2026-10-25T02:30:00+01:00:",
        "  1. erin (nights) until 2026-10-25T08:00:00+01:00",
        "  2. alice (primary) until 2026-10-26T09:00:00+01:00",
    ]


def test_the_default_escalation_in_the_section_is_no_obstacle(tmp_path: Path) -> None:
    """`oncall.escalation` (the default layers, checked with the gateway's settings) may sit
    beside the schedules; `oncall now` answers from the schedules."""
    path = tmp_path / "c.yaml"
    path.write_text(
        EXAMPLE.read_text()
        + "  escalation: {layers: [{name: l, members: [{name: a, phone: '+4915100000001'}]}]}\n"
    )
    code, out, err = run_cli("now", "--config", str(path), "--at", "2026-10-25T02:30+01:00")
    assert code == 0, err
    assert out.splitlines()[1] == "  1. erin (nights) until 2026-10-25T08:00:00+01:00"


@pytest.mark.parametrize(
    ("config", "args", "code", "expected"),
    [
        ("oncall: {people: {a: {}}, schedules: {s: {timezone: Mars/Olympus, layers: []}}}", [], 1,
         "oncall.schedules.s.timezone: unknown time zone 'Mars/Olympus'"),
        ("gateway: {}", [], 1, "no top-level oncall: section"),
        ("oncall: [", [], 1, "cannot read"),
        (EXAMPLE.read_text(), ["--schedule", "nope"], 2, "no schedule 'nope'"),
        (EXAMPLE.read_text() + SECOND_SCHEDULE, [], 2,
         "has several schedules; pick one with --schedule: ['b', 'gpu-infra']"),
        (EXAMPLE.read_text(), ["--at", "yesterday"], 2, "not an ISO 8601 date-time"),
        (EXAMPLE.read_text(), ["--at", "9999-12-31T00:00Z"], 2, "not between the years"),
        (EXAMPLE.read_text(), ["--at", "0001-01-01T00:00"], 2, "not between the years"),
    ],
)  # fmt: skip
def test_errors_are_one_clear_line(
    tmp_path: Path, config: str, args: list[str], code: int, expected: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(config)
    got, out, err = run_cli("now", "--config", str(path), *args)
    assert got == code, (out, err)
    assert expected in err and "Traceback" not in err
