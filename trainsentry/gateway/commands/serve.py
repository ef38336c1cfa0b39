"""`trainsentry gateway`: run the alert gateway."""

from __future__ import annotations

import argparse
import gc
import logging
import os
from pathlib import Path

HELP = "run the alert gateway (Alertmanager webhook intake, policy, outbox, channels)"
DESCRIPTION = """\
Runs the alert gateway: POST /api/v1/alertmanager takes Alertmanager webhooks (v4), stores
every alert before answering, and sends notifications through the durable outbox.

With --trigger-listen (TRAINSENTRY_TRIGGER_LISTEN, gateway.trigger_listen) the probes' hang
triggers are also taken on a port of their own, answered by a child process of the gateway
(docs/gateway.md, "Hang triggers").

Settings: flags > TRAINSENTRY_* environment > --config FILE > defaults.
Secrets only from the environment: TRAINSENTRY_WEBHOOK_TOKEN (bearer token Alertmanager
must send), TRAINSENTRY_API_TOKEN (read and ack API).

Exit codes: 0 stopped cleanly, 1 could not start (store unreachable, schema too new),
2 bad arguments or configuration (also: a config or policy file missing or invalid, a
database URL no driver takes, a SQLite database whose folder does not exist).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (0.0.0.0:9095)")
    parser.add_argument(
        "--trigger-listen",
        metavar="HOST:PORT",
        help="the probes' hang triggers also on this port, from a process of its own (unset)",
    )
    parser.add_argument("--db", metavar="URL", help="sqlite:///PATH (default) or postgresql://...")
    parser.add_argument("--config", metavar="FILE", type=Path, help="YAML settings file")
    parser.add_argument(
        "--console-file", metavar="FILE", type=Path, help="append console notifications here"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="DEBUG, INFO (INFO), WARNING, ERROR",
    )


# The collector's first threshold: a storm's batch allocates tens of thousands of short-lived
# objects; at the default (700) most of them were scanned, promoted and scanned again
# before dying (bench/bench_storm_vs_alertmanager.py: 14% of the gateway's time in a storm).
GC_THRESHOLD = 20_000


async def _settle_heap(_app: object) -> None:
    """Once the gateway is up: what startup built (modules, models, the store's metadata)
    lives as long as the process, so the collector stops scanning it (`gc.freeze`), and
    collects young objects less often."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, middle, oldest)


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from trainsentry.config import ConfigError, load_settings
    from trainsentry.gateway.assemble import app_from_settings
    from trainsentry.logs import configure_logging
    from trainsentry.store.engine import async_url, require_directory
    from trainsentry.store.errors import StoreError

    configure_logging(args.log_level)

    try:
        settings = load_settings(
            args.config,
            overrides={
                "gateway": {
                    "listen": args.listen,
                    "trigger_listen": args.trigger_listen,
                    "db": args.db,
                    "console_file": args.console_file,
                }
            },
        )
        gateway = settings.gateway
        async_url(gateway.db)  # refuses a URL no driver takes, without showing its password
        require_directory(gateway.db)  # names a SQLite file's missing folder
        app = app_from_settings(settings, os.environ)
    except (ConfigError, StoreError) as exc:
        logging.getLogger("trainsentry").error("configuration error: %s", exc)
        return 2
    app.on_startup.append(_settle_heap)
    try:
        web.run_app(
            app,
            host=gateway.host,
            port=gateway.port,
            print=None,
            access_log=None,
            handle_signals=True,
            keepalive_timeout=gateway.idle_timeout_s,
            backlog=gateway.listen_backlog,
        )
    except Exception as exc:
        logging.getLogger("trainsentry").error("gateway failed: %s: %s", type(exc).__name__, exc)
        return 1
    return 0
