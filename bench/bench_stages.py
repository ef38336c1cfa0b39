"""Where an alert's CPU goes inside the gateway: parse, store, plan, each per alert, in-process.

Each stage is timed next to a floor measured in the same run on the same alerts:
- parse: `parse_webhook` vs `orjson.loads` of the same bodies (JSON alone, no validation);
- store: `record_receipts` in group commits of 16 webhooks (as the intake batches them) vs
  SQLite alone committing the same receipt, alert, event and inbox rows, built beforehand
  (sqlite_floor.py: the database engine's own cost, no Python per row);
- plan: the policy worker working off the inbox vs the pure `decide()` on the same changes
  (the decision logic without loading, saving or writing notifications).

SQLite file in a temp dir, `synchronous=FULL` as the gateway runs it. Rounds use fresh stores
and fresh alerts; medians are printed. The throughput benchmark is bench_intake.py; this one
says which stage to work on.

    .venv/bin/python -m bench.bench_stages [--webhooks 320] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.bench_intake import ALERTS_PER_POST, bodies
from bench.sqlite_floor import GROUP_COMMIT, engine_seconds
from trainsentry.gateway.policy.decide import decide
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.store.engine import create_engine, migrate
from trainsentry.store.inbox import claim_inbox
from trainsentry.store.writes import record_receipts


def timed(run: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    """The fastest of `repeat` runs (seconds) and the last run's result."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


async def one_round(tmp: Path, round_no: int, webhooks: int) -> dict[str, tuple[float, float]]:
    raw = bodies(webhooks, offset=round_no * webhooks * ALERTS_PER_POST)
    alerts = webhooks * ALERTS_PER_POST
    per = 1e6 / alerts  # seconds for all alerts -> µs per alert
    figures: dict[str, tuple[float, float]] = {}

    json_s, _ = timed(lambda: [orjson.loads(body) for body in raw], repeat=3)
    parse_s, receipts = timed(lambda: [parse_webhook(body) for body in raw], repeat=3)
    figures["parse"] = (parse_s * per, json_s * per)

    engine = create_engine(f"sqlite:///{tmp / f'stages-{round_no}.db'}")
    await migrate(engine)
    started = time.perf_counter()
    for start in range(0, len(receipts), GROUP_COMMIT):
        async with engine.begin() as conn:
            await record_receipts(conn, receipts[start : start + GROUP_COMMIT])
    store_s = time.perf_counter() - started
    floor_s = await asyncio.to_thread(engine_seconds, tmp / f"floor-{round_no}.db", raw)
    figures["store"] = (store_s * per, floor_s * per)

    plan = PolicyPlan(load_policy(), channels=("console",))
    async with engine.connect() as conn:
        changes = (await claim_inbox(conn, alerts)).changes
    decide_s, _ = timed(lambda: _decide_all(changes, plan))
    worker = PolicyWorker(engine, plan)
    started = time.perf_counter()
    planned = await worker.drain()
    plan_s = time.perf_counter() - started
    assert planned == alerts, (planned, alerts)
    figures["plan"] = (plan_s * per, decide_s * per)
    await engine.dispose()
    return figures


def _decide_all(changes: list[Any], plan: PolicyPlan) -> None:
    """decide() over the changes, threading each job's and fingerprint's state through."""
    from trainsentry.gateway.policy.storm import job_key

    fp_states: dict[str, Any] = {}
    storms: dict[str, Any] = {}
    now = changes[-1].at
    for change in changes:
        result = decide(
            change,
            fingerprint_state=fp_states.get(change.alert.fingerprint),
            storm_state=storms.get(job_key(change.alert.labels)),
            distinct_nodes_in_window=1,
            policy=plan.policy,
            now=now,
            channels=plan.channels,
        )
        fp_states[change.alert.fingerprint] = result.fingerprint_state
        storms[result.storm_state.job] = result.storm_state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--webhooks", type=int, default=320, help="webhooks per round (50 each)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds: list[dict[str, tuple[float, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.rounds):
            rounds.append(asyncio.run(one_round(Path(tmp), round_no, args.webhooks)))
            print(
                f"round {round_no}: "
                + "  ".join(f"{k} {v[0]:.1f}/{v[1]:.1f} µs" for k, v in rounds[-1].items()),
                flush=True,
            )
    floors = {"parse": "orjson.loads", "store": "SQLite engine alone", "plan": "decide() alone"}
    print(f"\nmedian of {args.rounds} rounds, µs per alert ({args.webhooks} webhooks of 50)")
    for stage, floor in floors.items():
        cost = statistics.median(r[stage][0] for r in rounds)
        base = statistics.median(r[stage][1] for r in rounds)
        print(f"  {stage:6s} {cost:7.1f}   floor {base:7.1f} ({floor}), ratio {cost / base:5.1f}")
    total = sum(statistics.median(r[s][0] for r in rounds) for s in floors)
    print(f"  total  {total:7.1f}   = {1e6 / total:,.0f} alerts/s on one core, all three stages")
    engine = statistics.median(r["store"][1] for r in rounds)
    print(f"  SQLite alone stores at most {1e6 / engine:,.0f} alerts/s here (one writer at a time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
