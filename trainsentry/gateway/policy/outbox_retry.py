"""When the outbox tries a failed notification again, and when it gives up: pure rules.

Nothing here reads a clock or does I/O; the outbox (gateway/stages/outbox.py) passes the
times in and writes the verdict.

- A notification gives up by elapsed time, not by attempt count: it is `dead` at the first
  failed try once it has been failing without a break for `give_up_after` of its priority
  (defaults: an hour for P0/P1, half an hour for P2/P3). A success ends the streak.
- The wait before the next try is between half and all of the time the streak has lasted,
  at least `base_delay` and at most `max_delay`: a back-off that roughly doubles from 1 s to
  5 min. The last try before giving up is placed at the give-up moment, so a row is never
  dead later than that moment plus one send.
- A rate-limit answer is no failure: the provider is up and answering, so it never makes a
  row dead and it ends a failing streak; the next try waits what the provider asked (or
  `rate_limit_delay`, at most `max_delay`), and never less than half the back-off of the
  streak it ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from trainsentry.alerts import Priority

DEFAULT_GIVE_UP_AFTER: Mapping[Priority, float] = {
    Priority.P0: 3600.0,
    Priority.P1: 3600.0,
    Priority.P2: 1800.0,
    Priority.P3: 1800.0,
}


@dataclass(frozen=True, slots=True)
class DeliveryRules:
    """Seconds throughout. `give_up_after` has an entry for every priority."""

    give_up_after: Mapping[Priority, float] = field(
        default_factory=lambda: dict(DEFAULT_GIVE_UP_AFTER)
    )
    base_delay: float = 1.0
    max_delay: float = 300.0
    rate_limit_delay: float = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What becomes of a row after a failed or rate-limited try."""

    dead: bool
    # when to try again (None when dead)
    retry_at: datetime | None
    # the failing streak's start to store (None: not failing, e.g. only rate-limited)
    failing_since: datetime | None


def backoff_ceiling(failing_for: float, rules: DeliveryRules) -> float:
    """Pure: the longest wait after a failure when the streak has lasted `failing_for` s."""
    return min(rules.max_delay, max(rules.base_delay, failing_for))


def after_failure(
    priority: Priority,
    failing_since: datetime | None,
    now: datetime,
    rules: DeliveryRules,
    jitter: float,
) -> Verdict:
    """Pure: the verdict on a failed try at `now` (`failing_since`: the streak's start so
    far, None when this is its first failure). `jitter` in [0, 1) picks the wait between
    half and all of the back-off ceiling (full-jitter style, so replicas spread out)."""
    since = failing_since if failing_since is not None and failing_since <= now else now
    failing_for = (now - since).total_seconds()
    give_up_at = since + timedelta(seconds=rules.give_up_after[priority])
    if now >= give_up_at:
        return Verdict(dead=True, retry_at=None, failing_since=since)
    ceiling = backoff_ceiling(failing_for, rules)
    wait = ceiling / 2 + (ceiling / 2) * min(max(jitter, 0.0), 1.0)
    retry_at = min(now + timedelta(seconds=wait), give_up_at)
    return Verdict(dead=False, retry_at=retry_at, failing_since=since)


def after_rate_limit(
    failing_since: datetime | None,
    now: datetime,
    retry_after: float | None,
    rules: DeliveryRules,
) -> Verdict:
    """Pure: the verdict on a rate-limited try at `now`: never dead, and the failing streak
    (if any) ends; the next try waits what the provider asked (or `rate_limit_delay`), at
    most `max_delay`, and no less than half the back-off of the streak it ends."""
    asked = retry_after if retry_after is not None and retry_after > 0 else rules.rate_limit_delay
    wait = min(rules.max_delay, asked)
    if failing_since is not None and failing_since <= now:
        wait = max(wait, backoff_ceiling((now - failing_since).total_seconds(), rules) / 2)
    return Verdict(dead=False, retry_at=now + timedelta(seconds=wait), failing_since=None)


@dataclass(frozen=True, slots=True)
class RetrySelection:
    """Which dead notifications to send again, and who asks (kept with the rows)."""

    by: str
    ids: tuple[int, ...] | None = None
    channel: str | None = None
    created_since: datetime | None = None


MAX_RETRY_IDS = 1000


def _printable(value: object, limit: int) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value.strip()) <= limit
        and value.isprintable()
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    )


def parse_retry_request(body: object, now: datetime) -> RetrySelection | str:
    """Pure: the selection a retry request asks for, or why it is refused. `body` is the
    JSON object `{"by": WHO, "ids": [N, ...], "channel": C, "since": ISO8601 | "2h",
    "all": true}`: at least one of ids, channel, since, or `all: true` (so nobody re-sends
    every dead row by accident); the filters given all apply."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    unknown = set(body) - {"by", "ids", "channel", "since", "all"}
    if unknown:
        return f"unknown field(s): {', '.join(sorted(map(str, unknown)))[:200]}"
    who = body.get("by")
    if not _printable(who, 200):
        return "'by' (who re-sends) is required: printable text, up to 200 characters"
    assert isinstance(who, str)
    ids = body.get("ids")
    if ids is not None and (
        not isinstance(ids, list)
        or not 0 < len(ids) <= MAX_RETRY_IDS
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        or not all(0 < i < 2**63 for i in ids)
    ):
        return f"'ids' must be a list of 1 to {MAX_RETRY_IDS} notification ids"
    channel = body.get("channel")
    if channel is not None and not _printable(channel, 64):
        return "'channel' must be a channel name, up to 64 characters"
    since = body.get("since")
    created_since = None
    if since is not None:
        created_since = parse_since(since, now) if isinstance(since, str) else None
        if created_since is None:
            return "'since' must be an ISO 8601 time or a duration like 30m, 2h, 1d"
    everything = body.get("all")
    if everything is not None and not isinstance(everything, bool):
        return "'all' must be true or false"
    if ids is None and channel is None and since is None and everything is not True:
        return "say which: 'ids', 'channel', 'since', or 'all': true"
    return RetrySelection(
        by=who.strip(),
        ids=tuple(ids) if ids is not None else None,
        channel=channel,
        created_since=created_since,
    )


def parse_since(text: str, now: datetime) -> datetime | None:
    """Pure: an ISO 8601 time (UTC when it names no zone) or a duration back from `now`
    (`90s`, `30m`, `2h`, `1d`); None when it is neither."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    text = text.strip()
    if len(text) > 64:
        return None
    if text[-1:] in units:
        try:
            amount = float(text[:-1])
        except ValueError:
            amount = -1.0
        if 0 <= amount <= 3650 * 86400 / units[text[-1]]:
            return now - timedelta(seconds=amount * units[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
