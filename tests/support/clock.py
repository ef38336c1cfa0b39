"""The gateway's clock in tests: a callable returning `now`, which only the test moves."""

from __future__ import annotations

from datetime import UTC, datetime


class Clock:
    """`clock()` is `clock.now`; a test moves time by assigning or adding to `now`.

    Starts at `start`, or at the current second (UTC, no microseconds) when none is given.
    `elapsed` is the seconds from the start to `now`.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self.start = start if start is not None else datetime.now(UTC).replace(microsecond=0)
        self.now = self.start

    def __call__(self) -> datetime:
        return self.now

    @property
    def elapsed(self) -> float:
        return (self.now - self.start).total_seconds()
