"""Where an alert's CPU goes inside the gateway: parse, store, plan, each per alert, in-process.

Each stage is timed next to a floor measured in the same run on the same alerts:
- parse: `parse_webhook` vs `orjson.loads` of the same bodies (JSON alone, no validation);
- store: `record_receipts` in group commits of 16 webhooks (as the intake batches them) vs
  SQLite alone committing the same receipt, alert, event and inbox rows, built beforehand
  (sqlite_floor.py: the database engine's own cost, no Python per row);
- plan: the policy worker working off the inbox vs the planner's pure steps on the same
  changes (`fold_into` per change, `flush` once: the decision logic without loading, saving
  or writing notifications).

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
from trainsentry.gateway.policy.decide import flush, fold_into
from trainsentry.gateway.policy.incident import IncidentBook
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import StormState, job_key
from trainsentry.gateway.policy.storm_fold import StormFold
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
    """The planner's pure steps over the changes as one batch, as `PolicyPlan` runs them:
    `fold_into` each change into its job's `StormFold` (each fingerprint's state threaded
    through), then `flush` the batch's incidents once."""
    fp_states: dict[str, Any] = {}
    folds: dict[str, StormFold] = {}
    book = IncidentBook(plan.policy)
    now = changes[-1].at
    for change in changes:
        key = job_key(change.alert.labels)
        fold = folds.get(key) or folds.setdefault(
            key, StormFold.of(StormState.new(change.alert.labels))
        )
        result = fold_into(
            fold,
            change,
            fingerprint_state=fp_states.get(change.alert.fingerprint),
            distinct_nodes_in_window=1,
            policy=plan.policy,
            now=now,
            incidents=book,
            channels=plan.channels,
        )
        fp_states[change.alert.fingerprint] = result.fingerprint_state
    flush(book, policy=plan.policy, now=now, channels=plan.channels)
    for fold in folds.values():
        fold.freeze()


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
    floors = {
        "parse": "orjson.loads",
        "store": "SQLite engine alone",
        "plan": "policy alone",
    }
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
