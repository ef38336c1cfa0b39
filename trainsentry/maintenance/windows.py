"""Maintenance-window requests (`POST /api/v1/maintenance` bodies, once the gateway serves
them): parsed, validated and turned into maintenance/types.py's MaintenanceWindow.

Pure: the caller passes the creation time. Any bad input raises OncallConfigError naming each
wrong field (`window.rrule: never fires ...`); no input makes it raise anything else.

Every window mutes something and ends, as Alertmanager requires of its silences: at least
one matcher must not match the empty string (silence/silence.go, validateSilence: "at least
one matcher must not match the empty string"), so `{"alertname": {"regex": ".*"}}` or
`{"nosuchlabel": ""}` is refused; a recurring rule needs COUNT or UNTIL; and the whole window,
first start to last end, is at most `max_total` (the caps are the caller's: the gateway
passes its `maintenance.*` settings when a window is made, none when it reads a stored one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, time, timedelta
from typing import Any

from trainsentry.maintenance.match import first_occurrence, outlasts
from trainsentry.maintenance.types import MaintenanceWindow, Matcher, Recurrence
from trainsentry.oncall.config import (
    FieldError,
    OncallConfigError,
    Problems,
    as_datetime,
    as_instant,
    as_mapping,
    as_text,
    parse_timezone,
)
from trainsentry.userregex import RegexRefused, compile_user_regex

__all__ = ["OncallConfigError", "match_item", "parse_window"]

DEFAULT_MAX_WINDOW = timedelta(hours=168)

_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WINDOW_KEYS = {
    "matchers", "reason", "created_by", "starts_at", "ends_at", "timezone",
    "rrule", "start", "duration_minutes", "since",
}  # fmt: skip
_ONE_OFF_KEYS = {"starts_at", "ends_at"}
_RECURRING_KEYS = {"rrule", "start", "duration_minutes", "since"}
_FREQS = {"DAILY", "WEEKLY", "MONTHLY", "YEARLY"}
_RULE_PARTS = {"FREQ", "INTERVAL", "COUNT", "UNTIL", "BYDAY", "BYMONTH", "BYMONTHDAY", "WKST"}
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def match_item(item: str) -> tuple[str, Any] | None:
    """Pure: one matcher as people write it (`LABEL=VALUE` equality, `LABEL~REGEX` a regular
    expression; the first of `=` and `~` decides) as a request's `matchers` entry, or None
    when it is neither. `trainsentry maintenance add --match` and the console's form."""
    label, eq, value = item.partition("=")
    regex_label, tilde, pattern = item.partition("~")
    if eq and (not tilde or len(label) < len(regex_label)):
        return label.strip(), value
    if tilde:
        return regex_label.strip(), {"regex": pattern}
    return None


def _rrule_refusal(text: str) -> str | None:
    """Why a rule is refused before dateutil sees it, or None.

    dateutil searches a rule that can never match (February 30th) period by period up to
    year 9999, seconds of CPU for a daily rule; so the parts that can make an empty rule
    (BYSETPOS, BYYEARDAY, BYWEEKNO, BYHOUR...) are left out, impossible month days are
    refused here, and a daily rule with an interval takes no filter.
    """
    parts: dict[str, str] = {}
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        if not sep or key in parts:
            return f"not an RRULE: {item[:40]!r}"
        if key not in _RULE_PARTS:
            return f"{key[:20]} is not supported (only {', '.join(sorted(_RULE_PARTS))})"
        parts[key] = value
    if parts.get("FREQ") not in _FREQS:
        return "FREQ must be DAILY, WEEKLY, MONTHLY or YEARLY (the time comes from start)"
    if (
        parts["FREQ"] == "DAILY"
        and parts.get("INTERVAL", "1") != "1"
        and len(parts.keys() & {"BYDAY", "BYMONTH", "BYMONTHDAY"})
    ):
        return "a DAILY rule with an INTERVAL takes no BYDAY, BYMONTH or BYMONTHDAY"
    for day in parts.get("BYDAY", "").split(","):
        nth = day[:-2].lstrip("+-")
        if nth and (not nth.isdigit() or not 1 <= int(nth) <= 5):
            return f"BYDAY {day[:12]!r}: the number before the day must be 1-5 or -1 to -5"
    months = parts.get("BYMONTH")
    monthdays = parts.get("BYMONTHDAY")
    if months and monthdays:
        try:
            longest = max(
                _DAYS_IN_MONTH[int(m) - 1] for m in months.split(",") if 1 <= int(m) <= 12
            )
            if all(abs(int(d)) > longest for d in monthdays.split(",")):
                return "BYMONTHDAY never falls in BYMONTH: the rule never fires"
        except ValueError:
            return "BYMONTH and BYMONTHDAY must be numbers"
    if "COUNT" not in parts and "UNTIL" not in parts:
        return "needs COUNT or UNTIL: a window must end (without them the rule repeats forever)"
    return None


def _matchers(value: Any, field: str) -> tuple[Matcher, ...]:
    if not isinstance(value, Mapping) or not value:
        raise FieldError(field, "must map at least one label to a value or to {regex: ...}")
    found = []
    for label, want in value.items():
        where = f"{field}.{str(label)[:64]}"
        if not isinstance(label, str) or not _LABEL.match(label):
            raise FieldError(where, "is not a label name")
        if isinstance(want, str):
            found.append(Matcher(label=label, value=want))
            continue
        raw = as_mapping(want, where, {"regex"}, {"regex"})
        if not isinstance(raw["regex"], str):
            raise FieldError(f"{where}.regex", "must be a string")
        try:
            found.append(Matcher(label=label, pattern=compile_user_regex(raw["regex"])))
        except RegexRefused as exc:
            raise FieldError(f"{where}.regex", str(exc)) from None
    if all(matcher.matches_empty for matcher in found):
        raise FieldError(
            field,
            "every matcher matches the empty string (what a label the alert lacks reads as), so "
            "the window would mute alerts that carry none of these labels: at least one matcher "
            "must need a value (Alertmanager refuses such silences too)",
        )
    return tuple(found)


def _recurrence(
    raw: dict[str, Any],
    field: str,
    created_at: datetime,
    max_window: timedelta,
    max_total: timedelta | None,
) -> Recurrence:
    tz = parse_timezone(raw.get("timezone"), f"{field}.timezone")
    text = as_text(raw.get("rrule"), f"{field}.rrule").upper()
    if text.startswith("RRULE:"):
        text = text[len("RRULE:") :]
    if "\n" in text or "DTSTART" in text:
        raise FieldError(
            f"{field}.rrule", "give one RRULE line; the start comes from start and since"
        )
    refusal = _rrule_refusal(text)
    if refusal is not None:
        raise FieldError(f"{field}.rrule", refusal)
    start_text = raw.get("start")
    match = (
        re.match(r"^([0-2][0-9]):([0-5][0-9])$", start_text)
        if isinstance(start_text, str)
        else None
    )
    if match is None or int(match.group(1)) > 23:
        raise FieldError(f"{field}.start", "must be a local time 'HH:MM', like \"02:00\"")
    minutes = raw.get("duration_minutes")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes <= 0:
        raise FieldError(f"{field}.duration_minutes", "must be a whole number of minutes above 0")
    if minutes > max_window / timedelta(minutes=1):
        raise FieldError(f"{field}.duration_minutes", f"longer than the cap ({max_window})")
    since = raw.get("since")
    anchor = (
        created_at.astimezone(tz).date()
        if since is None
        else as_datetime(since, f"{field}.since").date()
    )
    recurrence = Recurrence(
        rrule=text,
        start=time(int(match.group(1)), int(match.group(2))),
        anchor=anchor,
        tz=tz,
        duration=timedelta(minutes=minutes),
    )
    try:
        first = first_occurrence(recurrence)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise FieldError(f"{field}.rrule", f"not an RRULE: {str(exc)[:120]}") from None
    if first is None:
        raise FieldError(
            f"{field}.rrule", f"never fires (no occurrence within 10 years of {anchor})"
        )
    if max_total is not None and outlasts(recurrence, max_total):
        raise FieldError(
            f"{field}.rrule",
            f"the occurrences last longer than the cap in all ({max_total}, from the first "
            "start to the last end): a smaller COUNT or an earlier UNTIL",
        )
    return recurrence


def parse_window(
    value: Any,
    *,
    window_id: str,
    created_at: datetime,
    max_window: timedelta = DEFAULT_MAX_WINDOW,
    max_total: timedelta | None = DEFAULT_MAX_WINDOW,
    field: str = "window",
) -> MaintenanceWindow:
    """Pure: a maintenance window from its request body. One-off: `starts_at`, `ends_at`
    (with a UTC offset, or local to `timezone`); recurring: `rrule` (with COUNT or UNTIL),
    `start` ('HH:MM'), `duration_minutes`, `timezone` and optionally `since` (the rule's
    first day; default: `created_at`'s date there). Refused: a window (an occurrence) longer
    than `max_window`; one lasting longer than `max_total` from its first start to its last
    end (None: not checked); matchers that all match the empty string."""
    problems = Problems()
    raw = problems.check(lambda: as_mapping(value, field, _WINDOW_KEYS, {"matchers"}))
    problems.raise_any()
    assert raw is not None
    matchers = problems.check(lambda: _matchers(raw["matchers"], f"{field}.matchers"))
    texts = {}
    for key in ("reason", "created_by"):
        item = raw.get(key, "")
        if not isinstance(item, str):
            problems.add(f"{field}.{key}", "must be a string")
        texts[key] = item if isinstance(item, str) else ""
    one_off, recurring = _ONE_OFF_KEYS & set(raw), _RECURRING_KEYS & set(raw)
    starts_at = ends_at = None
    recurrence = None
    if one_off and recurring:
        problems.add(field, "give starts_at/ends_at or rrule/start/duration_minutes, not both")
    elif recurring:
        recurrence = problems.check(
            lambda: _recurrence(raw, field, created_at, max_window, max_total)
        )
    else:
        tz = problems.check(
            lambda: (
                None
                if raw.get("timezone") is None
                else parse_timezone(raw["timezone"], f"{field}.timezone")
            )
        )
        for key in sorted(_ONE_OFF_KEYS - set(raw)):
            problems.add(f"{field}.{key}", "is required")
        if not problems.found:
            starts_at = problems.check(
                lambda: as_instant(raw["starts_at"], f"{field}.starts_at", tz)
            )
            ends_at = problems.check(lambda: as_instant(raw["ends_at"], f"{field}.ends_at", tz))
        if starts_at is not None and ends_at is not None:
            if ends_at <= starts_at:
                problems.add(f"{field}.ends_at", "is not after starts_at")
            elif ends_at - starts_at > (cap := min(max_window, max_total or max_window)):
                problems.add(f"{field}.ends_at", f"the window is longer than the cap ({cap})")
    problems.raise_any()
    return MaintenanceWindow(
        id=window_id,
        matchers=matchers or (),
        reason=texts["reason"],
        created_by=texts["created_by"],
        starts_at=starts_at,
        ends_at=ends_at,
        recurring=recurrence,
    )
