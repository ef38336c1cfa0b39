"""`trainsentry demo`: the whole alert path on an embedded store, replaying a recorded incident.

The real gateway (HTTP intake, store, policy, outbox) runs in-process on 127.0.0.1 with a
SQLite file in the output folder; the incident's webhooks are POSTed to it over HTTP. Time
is virtual: the gateway's clock jumps to each webhook's moment, so 30 minutes of incident
replay in seconds and the policy's windows (storms, flapping, held resolutions) behave as
they would in real time. The channels are previews that write what would be sent.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "replay a recorded incident through the whole alert path, offline"
DESCRIPTION = """\
Runs the gateway on a temporary SQLite store, replays a recorded incident (a 64-node training
job: a GPU falls off the bus, an InfiniBand port flaps, 200 disk alerts at once, then
recovery, then a maintenance window for the GPU swap that mutes the alert it raises) and
writes what would have been sent: Feishu cards (cards/*.json), spreadsheet rows
(sheet.csv), phone calls (calls.jsonl), console lines (console.jsonl) and an HTML preview
(index.html). No network, no cluster.

Exit codes: 0 done, 1 the replay failed.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("trainsentry-demo"),
        help="output folder (./trainsentry-demo)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import logging

    from trainsentry.demo.replay import run_demo

    logging.basicConfig(level=logging.WARNING)
    try:
        summary = asyncio.run(run_demo(args.out.resolve()))
    except Exception as exc:  # the demo must explain a failure, not dump a trace
        print(f"demo failed: {type(exc).__name__}: {exc}")
        return 1
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="trainsentry demo", show_header=False)
    for key, value in summary.items():
        if key != "outputs":
            table.add_row(key, str(value))
    console.print(table)
    console.print("outputs:")
    for name, path in summary["outputs"].items():
        console.print(f"  {name:8s} {path}")
    return 0
