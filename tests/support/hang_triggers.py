"""A probe's hang-trigger body as `probe/trigger.py` posts it (its fields and their shape:
tests/probe/test_trigger.py checks the probe's own), for tests that post many: a rank's
all_reduce stalled 21 s past a 20 s threshold, on its node's port 9401 + local rank."""

from __future__ import annotations

import json
from typing import Any


def trigger_json(namespace: str, name: str, rank: int, seq: int, **changes: Any) -> bytes:
    """The body of `rank`'s trigger of TrainingJob `namespace/name`, waiting at `seq` in
    group `rank % 7` unless `changes` say otherwise (any field, e.g. `pg`, `resolved`)."""
    body = {
        "namespace": namespace,
        "trainingjob": name,
        "rank": rank,
        "local_rank": rank % 8,
        "port": 9401 + rank % 8,
        "pg": str(rank % 7),
        "seq": seq,
        "op": "all_reduce",
        "waited_s": 21.0,
        "threshold_s": 20.0,
    }
    return json.dumps(body | changes).encode()
