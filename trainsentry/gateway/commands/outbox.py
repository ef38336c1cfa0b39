"""`trainsentry outbox retry`: send dead notifications again, audited."""

from __future__ import annotations

import argparse
import getpass
import sys

HELP = "re-send dead notifications (after a provider outage), audited"
DESCRIPTION = """\
retry: dead notifications (a provider refused them, or failed for longer than
gateway.give_up_after_seconds) go back to the outbox, due now, with a fresh give-up time;
the running gateway sends them within a few seconds. Who asked (--by, default your user
name) and when are stored with each row (retried_by, retried_at) and logged.

Select with any of --id (repeatable), --channel, --since (ISO 8601 time or a duration back
from now: 30m, 2h, 1d; matches when the notification was created), all of them applying;
or --all for every dead notification. The same is POST /api/v1/notifications/retry.

It writes the store directly (--db, the gateway's store URL); a SQLite file that does not
exist is refused, never created.

Exit codes: 0 re-sent, 1 the store could not be written, 2 bad arguments (also: no store
at --db, a URL no driver takes), 3 no dead notification matched.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    retry = sub.add_parser(
        "retry",
        help="send dead notifications again",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    retry.add_argument("--db", required=True, metavar="URL", help="the gateway's store URL")
    retry.add_argument("--id", dest="ids", type=int, action="append", metavar="N")
    retry.add_argument("--channel", metavar="C", help="only this channel's")
    retry.add_argument("--since", metavar="TIME", help="only those created since (or 2h)")
    retry.add_argument("--all", action="store_true", help="every dead notification")
    retry.add_argument("--by", default=None, help="who re-sends (default: your user name)")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from trainsentry.alerts import utcnow
    from trainsentry.gateway.policy.outbox_retry import parse_retry_request
    from trainsentry.store.errors import StoreMissing, StoreUrlError

    body: dict[str, object] = {"by": args.by or f"{getpass.getuser()} (cli)"}
    for key in ("ids", "channel", "since"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.all:
        body["all"] = True
    selection = parse_retry_request(body, utcnow())
    if isinstance(selection, str):
        print(f"trainsentry outbox retry: {selection}", file=sys.stderr)
        return 2
    try:
        retried = asyncio.run(_retry(args.db, selection))
    except (StoreMissing, StoreUrlError) as exc:
        print(f"trainsentry outbox retry: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"outbox retry failed: {type(exc).__name__}: {exc}")
        return 1
    if not retried:
        print("no dead notification matched")
        return 3
    shown = ", ".join(map(str, retried[:20])) + (" ..." if len(retried) > 20 else "")
    print(f"re-sent {len(retried)} dead notification(s) by {selection.by}: {shown}")
    return 0


async def _retry(db_url: str, selection: object) -> list[int]:
    from trainsentry.alerts import utcnow
    from trainsentry.gateway.policy.outbox_retry import RetrySelection
    from trainsentry.store.engine import check_schema, create_engine
    from trainsentry.store.errors import StoreError
    from trainsentry.store.outbox import requeue_dead
    from trainsentry.store.schema import SCHEMA_VERSION

    assert isinstance(selection, RetrySelection)
    engine = create_engine(db_url, must_exist=True)
    try:
        if await check_schema(engine) < SCHEMA_VERSION:
            raise StoreError("the store predates this trainsentry: start its gateway first")
        async with engine.begin() as conn:
            return await requeue_dead(
                conn,
                ids=selection.ids,
                channel=selection.channel,
                created_since=selection.created_since,
                by=selection.by,
                now=utcnow(),
            )
    finally:
        await engine.dispose()
