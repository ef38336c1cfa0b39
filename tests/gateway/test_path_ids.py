"""`parse_id`: a path's id, one parser and one bound for the API and the console."""

from __future__ import annotations

import pytest

from trainsentry.gateway.api.path_ids import MAX_ID, MAX_INCIDENT_ID, id_problem, parse_id


@pytest.mark.parametrize(
    ("raw", "maximum", "expected"),
    [
        ("1", MAX_ID, 1),
        ("007", MAX_ID, 7),
        (str(MAX_ID), MAX_ID, MAX_ID),  # 19 digits, the store's largest id
        (str(MAX_ID + 1), MAX_ID, None),
        ("9" * 20, MAX_ID, None),  # never converted
        ("1" * 5000, MAX_ID, None),
        ("0", MAX_ID, None),
        ("", MAX_ID, None),
        ("-1", MAX_ID, None),
        ("1e3", MAX_ID, None),
        ("٣", MAX_ID, None),  # a digit, not an ASCII one
        (str(MAX_INCIDENT_ID), MAX_INCIDENT_ID, MAX_INCIDENT_ID),
        (str(MAX_INCIDENT_ID + 1), MAX_INCIDENT_ID, None),
    ],
)
def test_parse_id(raw: str, maximum: int, expected: int | None) -> None:
    assert parse_id(raw, maximum) == expected


def test_the_refusal_names_the_bound() -> None:
    assert id_problem("alert") == f"alert id must be an integer from 1 to {MAX_ID}"
