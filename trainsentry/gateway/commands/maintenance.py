"""`trainsentry maintenance add|list|end`: maintenance windows through the gateway's API."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

HELP = "maintenance windows: mute matching alerts for a while (add, list, end)"
DESCRIPTION = """\
Maintenance windows through the gateway's API (/api/v1/maintenance). While a window is
active, a matching alert is stored and archived as always but sends no chat card and rings
no phone; if it still fires when the window ends, it is notified then.

  add   --match LABEL=VALUE (equality) or --match LABEL~REGEX (RE2, full match), repeatable,
        all must hold, at least one must need a value (not only match a missing label); then
        either a one-off window: --start TIME (default now) and --end TIME or --duration 2h;
        or a recurring one, which must end: --rrule 'FREQ=WEEKLY;BYDAY=TU;COUNT=4' --at 02:00
        --duration 120m --timezone Europe/Berlin. TIME is ISO 8601 with an offset (or local
        to --timezone). --reason says why; --by who (default: your user name).
  list  the windows not over yet (--all: every window), --json for the API's answer
  end   ID: ends the window now (--by who)

The API token comes from TRAINSENTRY_API_TOKEN; the gateway from --gateway or
TRAINSENTRY_GATEWAY_URL (default http://127.0.0.1:9095).

Exit codes: 0 done, 1 the gateway refused or could not be reached, 2 bad arguments (also a
window the gateway refuses as invalid: the message names the field), 3 no such window.
"""


def _minutes(text: str) -> int:
    units = {"m": 1, "h": 60, "d": 1440}
    try:
        value = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use 30m, 2h, 1d)") from None
    if not 0 < value < 10**7 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole number of minutes above 0: {text!r}")
    return int(value)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateway", default=None, metavar="URL", help="the gateway's base URL")
    parser.add_argument("--json", action="store_true", help="print the gateway's answer as JSON")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="make a window", description=DESCRIPTION)
    add.add_argument("--match", action="append", required=True, metavar="LABEL=VALUE|LABEL~RE")
    add.add_argument("--start", default=None, metavar="TIME", help="one-off: start (default now)")
    add.add_argument("--end", default=None, metavar="TIME", help="one-off: end")
    add.add_argument("--duration", type=_minutes, default=None, metavar="D", help="2h, 90m")
    add.add_argument(
        "--rrule",
        default=None,
        help="recurring: an RRULE with COUNT or UNTIL, FREQ=WEEKLY;BYDAY=TU;COUNT=4",
    )
    add.add_argument("--at", default=None, metavar="HH:MM", help="recurring: local start time")
    add.add_argument("--since", default=None, metavar="DATE", help="recurring: first day")
    add.add_argument("--timezone", default=None, help="IANA time zone, e.g. Europe/Berlin")
    add.add_argument("--reason", default="", help="why (shown with the window)")
    add.add_argument("--by", default=None, help="who makes it (default: your user name)")
    _common(add)
    listing = sub.add_parser("list", help="show windows", description=DESCRIPTION)
    listing.add_argument("--all", action="store_true", help="past and ended windows too")
    _common(listing)
    end = sub.add_parser("end", help="end a window now", description=DESCRIPTION)
    end.add_argument("window_id", metavar="ID")
    end.add_argument("--by", default=None, help="who ends it (default: your user name)")
    _common(end)


def window_body(args: argparse.Namespace, now_iso: str) -> dict[str, Any] | str:
    """The request for `add` from the arguments, or why they are wrong."""
    from trainsentry.maintenance.windows import match_item

    matchers: dict[str, Any] = {}
    for item in args.match:
        found = match_item(item)
        if found is None:
            return f"--match {item!r}: use LABEL=VALUE or LABEL~REGEX"
        matchers[found[0]] = found[1]
    body: dict[str, Any] = {
        "matchers": matchers,
        "reason": args.reason,
        "created_by": args.by or getpass.getuser(),
    }
    if args.timezone:
        body["timezone"] = args.timezone
    if args.rrule:
        if args.start or args.end:
            return "--rrule takes --at and --duration, not --start or --end"
        if not args.at or not args.duration:
            return "--rrule needs --at HH:MM and --duration"
        body.update(rrule=args.rrule, start=args.at, duration_minutes=args.duration)
        if args.since:
            body["since"] = args.since
        return body
    if args.at or args.since:
        return "--at and --since are for recurring windows (--rrule)"
    if (args.end is None) == (args.duration is None):
        return "give --end or --duration (one of them)"
    start = args.start or now_iso
    body["starts_at"] = start
    if args.end is not None:
        body["ends_at"] = args.end
    else:
        from datetime import datetime, timedelta

        try:
            begin = datetime.fromisoformat(start)
        except ValueError:
            return f"--start {start!r}: not an ISO 8601 time"
        if begin.tzinfo is None:
            return "--duration needs --start with a UTC offset"
        body["ends_at"] = (begin + timedelta(minutes=args.duration)).isoformat()
    return body


def _show(window: dict[str, Any]) -> str:
    matchers = ", ".join(
        f"{k}~{v['regex']}" if isinstance(v, dict) else f"{k}={v}"
        for k, v in (window.get("matchers") or {}).items()
    )
    if window.get("rrule"):
        when = (
            f"{window['rrule']} at {window.get('start')} for {window.get('duration_minutes')}m"
            f" ({window.get('timezone')})"
        )
    else:
        when = f"{window.get('starts_at')} .. {window.get('ends_at')}"
    state = "ACTIVE" if window.get("active") else "ended" if window.get("ended_at") else "waiting"
    ended = ""
    if window.get("ended_at"):
        ended = f" ended by {window['ended_by']} at {window['ended_at']}"
    return (
        f"{window['id']}  {state:7}  {matchers}  {when}  by {window.get('created_by')}"
        f"  {window.get('reason') or ''}{ended}"
    )


def run(args: argparse.Namespace) -> int:
    import json

    from trainsentry.alerts import utcnow
    from trainsentry.api_client import Answer, call, gateway_base, refused

    name = f"trainsentry maintenance {args.action}"
    path = "/api/v1/maintenance"
    if args.action == "add":
        body = window_body(args, utcnow().isoformat())
        if isinstance(body, str):
            print(f"{name}: {body}", file=sys.stderr)
            return 2
        answer = call(name, gateway_base(args.gateway), "POST", path, json=body)
    elif args.action == "list":
        params = {"all": "1"} if args.all else None
        answer = call(name, gateway_base(args.gateway), "GET", path, params=params)
    else:
        by = {"by": args.by or getpass.getuser()}
        answer = call(
            name, gateway_base(args.gateway), "DELETE", f"{path}/{args.window_id}", json=by
        )
    if not isinstance(answer, Answer):
        return answer
    if answer.status == 404 and args.action == "end":
        print(f"no maintenance window {args.window_id}")
        return 3
    if answer.status == 400:
        print(f"{name}: {answer.body.get('error', answer.body)}", file=sys.stderr)
        return 2
    if answer.status not in (200, 201):
        return refused(answer)
    if args.json:
        print(json.dumps(answer.body, indent=2))
    elif args.action == "list":
        items = answer.body.get("items", [])
        print("\n".join(_show(item) for item in items) if items else "no maintenance windows")
    else:
        print(_show(answer.body))
    return 0
