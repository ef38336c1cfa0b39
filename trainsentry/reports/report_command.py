"""`trainsentry report`: render the weekly report to a file, or send it by email."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

HELP = "weekly report: preview it as HTML (render) or email it once per period (send)"
DESCRIPTION = """\
The weekly report: what broke (alerts by priority, component, job; new, recurring,
flapping; storms), how fast we reacted (MTTA/MTTR median and p90, pages), where the
hardware is sick (nodes, GPUs, IB ports, XIDs) and the change against the period before.

  trainsentry report render --period last-week --out report.html
      writes the HTML with the charts embedded (data: URIs), to look before mailing;
      --text FILE and --csv FILE also write the plain-text part and the CSV attachment.
  trainsentry report send --period last-week [--force]
      mails the report (SMTP from channels.email) to the recipients in `reports:` —
      the cluster-wide report and one per team. Idempotent per audience and period (a
      record in the store's report_runs); --force sends again. Without an explicit
      period it also catches up full weeks missed since the last one sent. Run it
      from a CronJob (daily is fine: nothing is sent twice).

Periods: last-week (default), this-week, N-weeks-ago, YYYY-Www, YYYY-MM-DD..YYYY-MM-DD,
in reports.timezone (--tz overrides). Settings: --config FILE / TRAINSENTRY_CONFIG
(sections `reports:` and `channels.email:`), store from --db / TRAINSENTRY_DB.
SMTP password only from the environment variable named by channels.email.password_env.

Both only read a store the gateway created: a SQLite file that does not exist (a wrong
--db, or the default sqlite:///trainsentry.db in the wrong directory) is refused, never
created empty. `send` adds its own table (report_runs) to an existing store.

Exit codes: 0 done (send: everything due was sent or had been sent already),
1 failure (store unreachable, a send failed), 2 bad arguments or configuration (also: no
store at --db, an output file that cannot be written where given).
"""

log = logging.getLogger("trainsentry.reports")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--period",
        default="last-week",
        help="last-week (default), this-week, N-weeks-ago, YYYY-Www or YYYY-MM-DD..YYYY-MM-DD",
    )
    parser.add_argument("--db", metavar="URL", help="store: sqlite:///PATH or postgresql://...")
    parser.add_argument("--config", metavar="FILE", type=Path, help="YAML settings file")
    parser.add_argument("--tz", metavar="ZONE", help="timezone (reports.timezone, else UTC)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--now", metavar="ISO", help="pretend the current time is ISO (backfills, tests)"
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="DEBUG, INFO, WARNING (WARNING), ERROR",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="report_command", metavar="ACTION", required=True)
    render = sub.add_parser("render", help="write the report as HTML (images embedded)")
    _common(render)
    render.add_argument("--out", metavar="FILE", type=Path, required=True, help="HTML file")
    render.add_argument("--text", metavar="FILE", type=Path, help="also write the text part")
    render.add_argument("--csv", metavar="FILE", type=Path, help="also write the CSV")
    render.add_argument("--team", default="cluster", help="audience: cluster or a team name")
    send = sub.add_parser("send", help="email the report once per period and audience")
    _common(send)
    send.add_argument("--force", action="store_true", help="send even if already sent")
    send.add_argument(
        "--team", action="append", help="only this audience (cluster or a team; repeatable)"
    )


class UsageError(Exception):
    pass


def _now(text: str | None) -> datetime:
    from trainsentry.alerts import utcnow

    if not text:
        return utcnow()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"--now: not an ISO time: {text!r}") from exc
    if moment.tzinfo is None:
        raise UsageError("--now needs a timezone (e.g. 2026-11-20T09:00:00+00:00)")
    return moment


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(gateway settings, report settings, channels settings, stats options)."""
    from trainsentry.config import ConfigError, load_settings
    from trainsentry.config.channels import ChannelsSettings
    from trainsentry.gateway.policy import load_policy
    from trainsentry.reports.stats import StatsOptions

    try:
        # --tz is a flag: it wins over the file's reports.timezone
        overrides = {"gateway": {"db": args.db}, "reports": {"timezone": args.tz}}
        settings = load_settings(args.config, overrides=overrides)
        reports = settings.reports
        channels = settings.channels or ChannelsSettings()
        policy = load_policy(settings.gateway.policy_file)
    except ConfigError as exc:  # the policy file's PolicyError too
        raise UsageError(f"configuration error: {exc}") from None
    opts = StatsOptions.from_policy(
        policy,
        short_lived_s=reports.short_lived_s,
        maintenance_quiet_s=settings.maintenance.report_quiet_hours * 3600,
    )
    return settings.gateway, reports, channels, opts


def run(args: argparse.Namespace) -> int:
    import asyncio

    from trainsentry.logs import configure_logging
    from trainsentry.reports.period import PeriodError

    configure_logging(args.log_level)
    try:
        return asyncio.run(_run(args))
    except (UsageError, PeriodError) as exc:
        print(f"trainsentry report: {exc}", file=sys.stderr)
        return 2


# Writing an output file fails because of where it was asked to go (a bad argument, exit 2),
# or for another reason (a full disk: a failure, exit 1).
_BAD_PATH = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


async def _run(args: argparse.Namespace) -> int:
    from trainsentry.reports.period import parse_period
    from trainsentry.store.engine import check_schema, create_engine, migrate
    from trainsentry.store.errors import StoreError, StoreMissing, StoreUrlError

    gateway, reports, channels, opts = _load(args)
    now = _now(args.now)
    # the period is checked before touching the store (send parses it again per audience)
    parse_period(args.period, now, reports.timezone, reports.week_start)
    if (
        args.report_command == "render"
        and args.team != "cluster"
        and args.team not in reports.teams
    ):
        raise UsageError(f"unknown team {args.team!r}")
    sending = _send_setup(args, reports, channels) if args.report_command == "send" else None
    try:
        # A read-only use: a SQLite file that is not there is a wrong --db, not a new store.
        engine = create_engine(gateway.db, must_exist=True)
    except (StoreUrlError, StoreMissing) as exc:
        raise UsageError(str(exc)) from None
    except StoreError as exc:  # e.g. this Python's SQLite is too old
        print(f"trainsentry report: store unusable: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            if sending is None:
                await check_schema(engine)  # render reads, and changes nothing
            else:
                await migrate(engine, create=False)  # send's report_runs, never a new store
        except StoreMissing as exc:
            raise UsageError(str(exc)) from None
        except (StoreError, OSError) as exc:
            print(f"trainsentry report: store unusable: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # driver errors: unreachable server, bad credentials
            print(
                f"trainsentry report: store unreachable: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 1
        if args.report_command == "render":
            return await _render(args, engine, reports, opts, now)
        assert sending is not None
        return await _send(args, engine, reports, opts, now, *sending)
    finally:
        await engine.dispose()


async def _render(
    args: argparse.Namespace, engine: Any, reports: Any, opts: Any, now: datetime
) -> int:
    from trainsentry.reports.delivery import build
    from trainsentry.reports.period import parse_period

    period = parse_period(args.period, now, reports.timezone, reports.week_start)
    stats, report = await build(engine, reports, period, args.team, opts)
    outputs: list[tuple[Path, bytes]] = [(args.out, report.preview_html.encode("utf-8"))]
    if args.text:
        outputs.append((args.text, report.text.encode("utf-8")))
    if args.csv:
        outputs.append((args.csv, report.csv))
    for path, content in outputs:
        try:
            path.write_bytes(content)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            message = f"cannot write {path}: {reason}"
            if isinstance(exc, _BAD_PATH):
                raise UsageError(message) from None
            print(f"trainsentry report: {message}", file=sys.stderr)
            return 1
    if args.json:
        print(
            json.dumps(
                {
                    "period": period.key,
                    "title": period.title,
                    "out": str(args.out),
                    "subject": report.subject,
                    "alerts": stats.total,
                    "by_priority": dict(stats.by_priority),
                    "headline": [
                        {"label": a, "value": b, "note": c} for a, b, c in report.headline
                    ],
                }
            )
        )
    else:
        print(f"{report.subject}\nwrote {args.out}")
    return 0


def _send_setup(
    args: argparse.Namespace, reports: Any, channels: Any
) -> tuple[Any, Any, list[str]]:
    """(SMTP config, digest poster or None, audiences), checked before touching the store."""
    from trainsentry.notifiers.email import SmtpConfig
    from trainsentry.notifiers.settings import SecretMissing, read_secret
    from trainsentry.reports.delivery import feishu_digest_poster

    if channels.email is None:
        raise UsageError("no SMTP configured: set channels.email in the config file")
    audiences = list(args.team or reports.audiences())
    for name in audiences:
        if name != "cluster" and name not in reports.teams:
            raise UsageError(f"unknown team {name!r}")
    if not audiences:
        raise UsageError("no recipients: set reports.recipients or reports.teams")
    try:
        smtp = SmtpConfig.from_settings(channels.email)
        digest = None
        if reports.feishu_digest is not None:
            d = reports.feishu_digest
            secret = read_secret(d.secret_env) if d.secret_env else None
            digest = feishu_digest_poster(read_secret(d.url_env), secret, d.timeout_s)
    except SecretMissing as exc:
        raise UsageError(str(exc)) from exc
    return smtp, digest, audiences


async def _send(
    args: argparse.Namespace,
    engine: Any,
    reports: Any,
    opts: Any,
    now: datetime,
    smtp: Any,
    digest: Any,
    audiences: list[str],
) -> int:
    from trainsentry.reports.delivery import send_reports

    outcomes = await send_reports(
        engine,
        reports,
        smtp,
        now=now,
        spec=args.period,
        force=args.force,
        opts=opts,
        audiences=audiences,
        digest=digest,
    )
    if args.json:
        print(json.dumps({"results": [o.to_json() for o in outcomes]}))
    else:
        for o in outcomes:
            detail = o.message_id or o.reason
            print(f"{o.status:8} {o.audience:16} {o.period}  {detail}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0
