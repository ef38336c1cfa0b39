"""When a collective has waited too long for this process group: an adaptive threshold (pure).

A rank's probe sees, each poll, the oldest collective of each process group still in flight
and how long it has been in flight (`progress.PgReport`). What is "too long" depends on the
job: a tensor-parallel all_reduce normally completes in milliseconds, a data-parallel one
waits for the slowest rank's backward pass, a pipeline recv waits a whole stage. So the
detector learns, per group, how long its collectives are normally seen in flight, and calls
a wait a stall when it is both

- at least `floor_s` (20 s by default: a pause of a few seconds is never a page), and
- at least `factor` times the group's usual wait (the 95th percentile of the last `window`
  waits it saw end), or `startup_s` while fewer than `min_history` waits have been seen
  (the first collectives of a job include NCCL's connection set-up, compilation and the
  first data loading, which have no history to compare with).

Invariants:
- Time is passed in (monotonic seconds): the detector is deterministic under test.
- A wait is recorded as history only when it ends (the group's sequence number moves past
  it), with the last age seen, a lower bound of the real wait: history never includes the
  wait being judged. A poll that finds the group progressed with nothing in flight records
  a wait of 0: the poll instant is a random sample of the group's waits, and most samples
  of a healthy fast group find none (so its threshold falls to the floor within a few
  polls of training instead of after five waits happened to be caught).
- A stall is reported once per (group, sequence number): `observe` returns it the first
  time the threshold is passed and never again for that collective.
- Nothing in flight is never a stall, however long (evaluation, every rank saving its own
  checkpoint shard): only a collective some rank entered and is still waiting in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainsentry.probe.progress import PgReport

DEFAULT_FLOOR_S = 20.0
DEFAULT_FACTOR = 10.0
DEFAULT_STARTUP_S = 300.0
DEFAULT_MIN_HISTORY = 5
DEFAULT_WINDOW = 64


@dataclass(frozen=True)
class StallPolicy:
    """How long a wait must last to be a stall (see the module docstring)."""

    floor_s: float = DEFAULT_FLOOR_S
    factor: float = DEFAULT_FACTOR
    startup_s: float = DEFAULT_STARTUP_S
    min_history: int = DEFAULT_MIN_HISTORY
    window: int = DEFAULT_WINDOW

    def threshold(self, history: list[float]) -> float:
        """Pure: the wait, in seconds, past which a collective of this group is a stall."""
        if len(history) < self.min_history:
            return max(self.floor_s, self.startup_s)
        ordered = sorted(history)
        usual = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return max(self.floor_s, self.factor * usual)


@dataclass(frozen=True)
class Stall:
    """One collective this rank has waited in for longer than its group's threshold."""

    pg: str
    pg_desc: str
    seq: int
    op: str
    state: str
    waited_s: float
    threshold_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg,
            "pg_desc": self.pg_desc,
            "seq": self.seq,
            "op": self.op,
            "state": self.state,
            "waited_s": round(self.waited_s, 3),
            "threshold_s": round(self.threshold_s, 3),
        }


@dataclass
class _Group:
    history: deque[float]
    seq: int = -1
    age: float = 0.0
    reported: int = -1
    completed: int | None = None


@dataclass
class StallDetector:
    """Per-group wait history and the stalls it implies (see the module invariants)."""

    policy: StallPolicy = field(default_factory=StallPolicy)
    _groups: dict[str, _Group] = field(default_factory=dict)

    def observe(self, reports: Mapping[str, PgReport]) -> list[Stall]:
        """Pure but for the detector's own memory: the stalls first seen in this poll."""
        stalls = []
        for name, report in reports.items():
            group = self._groups.get(name)
            if group is None:
                group = self._groups[name] = _Group(deque(maxlen=self.policy.window))
            flight = report.progress.in_flight
            completed = report.progress.last_completed
            progressed = group.completed is not None and completed != group.completed
            group.completed = completed
            if group.seq >= 0 and (flight is None or flight.seq != group.seq):
                group.history.append(group.age)  # the wait seen last has ended
                group.seq, group.age = -1, 0.0
            elif flight is None and progressed:
                group.history.append(0.0)  # progress, and no wait caught at this instant
            if flight is None:
                continue
            group.seq, group.age = flight.seq, flight.age_seconds
            threshold = self.policy.threshold(list(group.history))
            if flight.age_seconds >= threshold and group.reported != flight.seq:
                group.reported = flight.seq
                stalls.append(
                    Stall(
                        pg=name,
                        pg_desc=report.progress.desc,
                        seq=flight.seq,
                        op=flight.op,
                        state=flight.state,
                        waited_s=flight.age_seconds,
                        threshold_s=threshold,
                    )
                )
        return stalls

    def thresholds(self) -> dict[str, float]:
        """The current threshold of every group seen (for `/status` and the metrics)."""
        return {
            name: self.policy.threshold(list(group.history)) for name, group in self._groups.items()
        }
