"""Builds schedules through the real config parser, and writes instants tersely."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainsentry.oncall.config import parse_oncall
from trainsentry.oncall.types import Schedule

EXAMPLE = Path(__file__).with_name("example.yaml")  # the example, as in docs
PEOPLE = {name: {} for name in ("alice", "bob", "carol", "dave", "erin", "frank")}


def schedule(timezone: str, layers: list[dict[str, Any]], overrides: Any = ()) -> Schedule:
    config = parse_oncall(
        {
            "people": PEOPLE,
            "schedules": {
                "s": {"timezone": timezone, "layers": layers, "overrides": list(overrides)}
            },
        }
    )
    return config.schedules["s"]


def utc(text: str) -> datetime:
    """'2026-10-26T08:00' read as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# The example (example.yaml) worked out by hand, not by our code: nights (dave, erin
# alternating daily from 19 Oct) 20:00-08:00 win over the weekly primary (alice, then bob from
# Monday 26 Oct 09:00, alice again 2 Nov); carol's override wins on 27 Oct 12:00-18:00; Berlin
# is +02:00 until 25 Oct 03:00, then +01:00.
# (local time of the change, who is paged from then on, through which layer)
HANDOFFS = [
    ("2026-10-19T09:00:00+02:00", "alice", "primary"),
    ("2026-10-19T20:00:00+02:00", "dave", "nights"),
    ("2026-10-20T08:00:00+02:00", "alice", "primary"),
    ("2026-10-20T20:00:00+02:00", "erin", "nights"),
    ("2026-10-21T08:00:00+02:00", "alice", "primary"),
    ("2026-10-21T20:00:00+02:00", "dave", "nights"),
    ("2026-10-22T08:00:00+02:00", "alice", "primary"),
    ("2026-10-22T20:00:00+02:00", "erin", "nights"),
    ("2026-10-23T08:00:00+02:00", "alice", "primary"),
    ("2026-10-23T20:00:00+02:00", "dave", "nights"),
    ("2026-10-24T08:00:00+02:00", "alice", "primary"),
    ("2026-10-24T20:00:00+02:00", "erin", "nights"),  # a 13-hour night: clocks go back
    ("2026-10-25T08:00:00+01:00", "alice", "primary"),
    ("2026-10-25T20:00:00+01:00", "dave", "nights"),
    ("2026-10-26T08:00:00+01:00", "alice", "primary"),
    ("2026-10-26T09:00:00+01:00", "bob", "primary"),  # weekly handoff, still 09:00 local
    ("2026-10-26T20:00:00+01:00", "erin", "nights"),
    ("2026-10-27T08:00:00+01:00", "bob", "primary"),
    ("2026-10-27T12:00:00+01:00", "carol", "override"),
    ("2026-10-27T18:00:00+01:00", "bob", "primary"),
    ("2026-10-27T20:00:00+01:00", "dave", "nights"),
    ("2026-10-28T08:00:00+01:00", "bob", "primary"),
    ("2026-10-28T20:00:00+01:00", "erin", "nights"),
    ("2026-10-29T08:00:00+01:00", "bob", "primary"),
    ("2026-10-29T20:00:00+01:00", "dave", "nights"),
    ("2026-10-30T08:00:00+01:00", "bob", "primary"),
    ("2026-10-30T20:00:00+01:00", "erin", "nights"),
    ("2026-10-31T08:00:00+01:00", "bob", "primary"),
    ("2026-10-31T20:00:00+01:00", "dave", "nights"),
    ("2026-11-01T08:00:00+01:00", "bob", "primary"),
    ("2026-11-01T20:00:00+01:00", "erin", "nights"),
    ("2026-11-02T08:00:00+01:00", "bob", "primary"),
    ("2026-11-02T09:00:00+01:00", "alice", "primary"),
]


def run_cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSENTRY_")}
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "oncall", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return done.returncode, done.stdout, done.stderr
