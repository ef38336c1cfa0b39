"""The ids a request's path names (an alert's, an incident's, an on-call override's): one
parser and one bound for the API and the console alike. Pure: no I/O."""

from __future__ import annotations

from trainsentry.alerts import MAX_ALERT_ID

# Ids are 64-bit in the store (SQLite refuses more): an alert's and an override's bound.
MAX_ID = MAX_ALERT_ID
MAX_INCIDENT_ID = 2**62  # the bound of an incident id in a path or a query (`before`)
# A 64-bit id has at most 19 digits: no more are converted (a long digit run is slow to
# convert, and refused past 4,300 digits).
_MAX_DIGITS = len(str(MAX_ID))


def parse_id(raw: str, maximum: int = MAX_ID) -> int | None:
    """Pure: the id `raw` spells, a whole number from 1 to `maximum` in ASCII digits; None
    for anything else (the caller answers 400 with `id_problem`'s words)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS):
        return None
    value = int(raw)
    return value if 0 < value <= maximum else None


def id_problem(what: str, maximum: int = MAX_ID) -> str:
    """Pure: why a path's id was refused, e.g. "alert id must be an integer from 1 to ..."."""
    return f"{what} id must be an integer from 1 to {maximum}"
