"""Channel rendering and planning costs, each against a simple baseline in the same run.

1. Storm card for a 2,000-alert storm: our fit (binary search on the list cap) vs the
   obvious baseline (drop one entry at a time until the card fits 20 KB).
2. Alert card render + JSON encode: median per card.
3. Escalation `plan` over 1,000 open incidents (the JSON state deep-copied each call) vs
   a bare `copy.deepcopy` of the same state (the floor `plan` cannot beat).

    .venv/bin/python -m bench.bench_channels [--rounds 7]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from trainsentry.alerts import Person, Priority
from trainsentry.gateway.policy.escalation import EscalationPolicy as Policy
from trainsentry.gateway.policy.escalation import Escalator, Layer, Roster, new_state
from trainsentry.notifiers.feishu import card as cards
from trainsentry.notifiers.payload_contract import parse_payload


def median_s(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def storm_payload(n: int) -> dict[str, Any]:
    items = [
        {"alert_id": i, "alertname": "NcclTimeout", "priority": "P1", "node": f"node-{i:04d}",
         "gpu": str(i % 8), "rank": str(i), "summary": "collective stuck for 10 minutes"}
        for i in range(n)
    ]  # fmt: skip
    return {
        "priority": "P1",
        "status": "firing",
        "job": "team-a/llama-70b",
        "storm": {"total": n, "items": items,
                  "by_node": {f"node-{i:04d}": 1 for i in range(n)},
                  "by_alertname": {"NcclTimeout": n}},
    }  # fmt: skip


def linear_fit(payload: Any, max_bytes: int) -> dict[str, Any]:
    """Baseline: shrink the cap one entry at a time from the full list."""
    storm = payload["storm"]
    limit = max(len(storm["items"]), len(storm["by_node"]))
    while True:
        trimmed = dict(payload)
        trimmed["storm"] = {**storm, "items": storm["items"][:limit],
                            "by_node": dict(list(storm["by_node"].items())[:limit])}  # fmt: skip
        card = cards.storm_card(trimmed, cards.CardOptions(max_bytes=10**9))
        if cards.card_bytes(card) <= max_bytes or limit == 0:
            return card
        limit -= max(1, limit // 200)  # even a generous step: 0.5 % of what is left


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    budget = cards.DEFAULT_OPTIONS.max_bytes

    payload = parse_payload(storm_payload(2000))
    ours = median_s(lambda: cards.storm_card(payload), rounds)
    base = median_s(lambda: linear_fit(payload, budget), max(3, rounds // 2))
    size = cards.card_bytes(cards.storm_card(payload))
    print(f"storm card 2000 alerts: ours {ours * 1e3:.1f} ms, linear baseline {base * 1e3:.1f} ms,"
          f" speed-up x{base / ours:.1f}; card {size} bytes (budget {budget})")  # fmt: skip

    alert = parse_payload({
        "priority": "P0", "status": "firing", "alert_id": 1, "alertname": "GpuXidError",
        "labels": {"trainingjob": "llama", "namespace": "a", "node": "n1", "gpu": "3"},
        "annotations": {"summary": "XID 79", "description": "d" * 500, "runbook_url": "https://r"},
        "starts_at": "2026-11-22T01:00:00Z",
    })  # fmt: skip
    per = median_s(
        lambda: [cards.compact_json(cards.alert_card(alert)) for _ in range(1000)], rounds
    )
    print(f"alert card render+encode: {per:.3f} ms per card (median of {rounds} rounds x 1000)")

    t0 = datetime(2026, 11, 22, tzinfo=UTC)
    esc = Escalator(Roster((Layer("l1", (Person("a"),)), Layer("l2", (Person("b"),)))), Policy())
    state = esc.open(new_state(), 0, Priority.P0, t0)
    for i in range(1, 1000):  # cloning is faster than 1000 opens (each copies the state)
        state["incidents"][str(i)] = copy.deepcopy(state["incidents"]["0"])
    plan_s = median_s(lambda: esc.plan(state, t0 + timedelta(minutes=5)), rounds)
    floor_s = median_s(lambda: copy.deepcopy(state), rounds)
    print(f"escalation plan, 1000 incidents: {plan_s * 1e3:.1f} ms;"
          f" deepcopy floor {floor_s * 1e3:.1f} ms (ratio x{plan_s / floor_s:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
