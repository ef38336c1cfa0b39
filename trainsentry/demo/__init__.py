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
from typing import Any

HELP = "replay a recorded incident through the whole alert path, offline"
DESCRIPTION = """\
Runs the gateway on a temporary SQLite store, replays a recorded incident (a 64-node training
job: a GPU falls off the bus, an InfiniBand port flaps, 200 disk alerts at once, then
recovery, then a maintenance window for the GPU swap that mutes the alert it raises) and
writes what would have been sent: Feishu cards (cards/*.json), spreadsheet rows
(sheet.csv), phone calls (calls.jsonl), console lines (console.jsonl) and an HTML preview
(index.html). No network, no cluster. With --serve the gateway stays up after the replay and
its incident console (/ui/) shows the incident until Ctrl-C, with one incident left open to
acknowledge: sign in with any name and the demo token it prints.

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
    parser.add_argument(
        "--serve",
        action="store_true",
        help="keep the gateway up after the replay and print its incident console's URL "
        "(until Ctrl-C)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="with --serve: the port on 127.0.0.1 (0: any free)"
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from trainsentry.demo.replay import run_demo

    logging.basicConfig(level=logging.WARNING)
    if not 0 <= args.port <= 65535:
        print(f"--port must be from 0 to 65535, got {args.port}")
        return 1

    async def serve(summary: dict[str, Any]) -> None:
        """Until Ctrl-C or SIGTERM. Handlers of our own, not Python's KeyboardInterrupt: a
        process started with SIGINT ignored (a parent's disposition is inherited) gets no
        KeyboardInterrupt, and SIGTERM (`docker stop`, a pod's end) must stop it too."""
        show(summary, args.json)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        print(f"demo token: {summary['demo token']} (sign in with any name and this token)")
        print(f"incident console: {summary['incident console']} (Ctrl-C to stop)", flush=True)
        await stop.wait()

    try:
        summary = asyncio.run(
            run_demo(args.out.resolve(), serve if args.serve else None, args.port)
        )
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the demo must explain a failure, not dump a trace
        print(f"demo failed: {type(exc).__name__}: {exc}")
        return 1
    if not args.serve:  # with --serve the summary was shown before the console's address
        show(summary, args.json)
    return 0


def show(summary: dict[str, Any], as_json: bool) -> None:
    import json

    if as_json:
        print(json.dumps(summary, indent=2, default=str), flush=True)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="trainsentry demo", show_header=False)
    for key, value in summary.items():
        if key == "outputs":
            continue
        if isinstance(value, dict):  # a table in the table, not a Python dict
            inner = Table(show_header=False, box=None, padding=(0, 1, 0, 0))
            for name, item in value.items():
                inner.add_row(str(name), str(item))
            table.add_row(key, inner)
        else:
            table.add_row(key, str(value))
    console.print(table)
    console.print("outputs:")
    for name, path in summary["outputs"].items():
        console.print(f"  {name:8s} {path}")
