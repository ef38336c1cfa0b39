"""`trainsentry oncall now`: who is on call, from the `oncall:` section of a config file."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

HELP = "who is on call (from the oncall: section of a config file); run-time overrides"
DESCRIPTION = """\
Who is on call, read from the top-level `oncall:` section of a configuration file
(docs/oncall.md); and run-time overrides and swaps, through the gateway's API.

  trainsentry oncall now --config FILE [--schedule NAME] [--at ISO8601] [--json]
  trainsentry oncall override add --schedule NAME --who PERSON [--replaces PERSON]
                                  --start ISO8601 --end ISO8601 [--reason TEXT] [--by NAME]
  trainsentry oncall override list [--schedule NAME] [--removed]
  trainsentry oncall override remove ID [--by NAME]
  trainsentry oncall feed [--schedule NAME]       (calendar subscription URLs, with their key)

The first person listed is the one paged; each has the layer that puts them there and
`until`, the next instant at which that changes (null if not within 400 days). --at without
a UTC offset is the schedule's local time; times are printed in the schedule's time zone.
--schedule may be left out when the file has one schedule.

JSON: {"schedule": ..., "at": ..., "on_call": [{"name": ..., "layer": ..., "until": ...}]}

Exit codes of `now`:
  0  answered
  1  the file cannot be read or its oncall: section is invalid (the message names the field)
  2  usage error (bad --at, unknown --schedule)
Exit codes of `override` and `feed`: 0 done, 1 the gateway refused (the reason names the
field) or could not be reached, 2 bad arguments, 3 no such override (`feed`: no such
schedule). The API token comes from TRAINSENTRY_API_TOKEN, the gateway from --gateway or
TRAINSENTRY_GATEWAY_URL.
"""


def _iso(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date-time: {value!r}") from None
    if not 1900 <= moment.year <= 8999:  # `until` looks 400 days ahead; dates end at 9999
        raise argparse.ArgumentTypeError(f"{value!r} is not between the years 1900 and 8999")
    return moment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="oncall_command", metavar="SUBCOMMAND", required=True)
    now = sub.add_parser("now", help="who is on call now (or --at)", description=HELP)
    now.add_argument("--config", required=True, metavar="FILE", help="YAML file with oncall:")
    now.add_argument("--schedule", metavar="NAME", help="the schedule (default: the only one)")
    now.add_argument("--at", type=_iso, metavar="ISO8601", help="this instant instead of now")
    now.add_argument("--json", action="store_true", help="print JSON")
    from trainsentry.oncall import remote

    override = sub.add_parser("override", help="run-time overrides and swaps (gateway API)")
    remote.add_arguments(override)
    feed = sub.add_parser("feed", help="calendar subscription URLs, with their key (gateway API)")
    remote.add_feed_arguments(feed)


def _fail(code: int, message: str) -> int:
    print(f"trainsentry oncall: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    if args.oncall_command == "override":
        from trainsentry.oncall import remote

        return remote.run(args)
    if args.oncall_command == "feed":
        from trainsentry.oncall import remote

        return remote.run_feed(args)
    return _now(args)


def _now(args: argparse.Namespace) -> int:
    import json
    from datetime import UTC
    from pathlib import Path

    import yaml

    from trainsentry.oncall.config import OncallConfigError, parse_oncall
    from trainsentry.oncall.schedule import on_call, wall_to_instant

    path = Path(args.config)
    try:
        loaded: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return _fail(1, f"cannot read {path}: {exc}")
    if not isinstance(loaded, dict) or "oncall" not in loaded:
        return _fail(1, f"{path}: no top-level oncall: section")
    try:
        config = parse_oncall(loaded["oncall"])
    except OncallConfigError as exc:
        return _fail(1, f"{path}: {exc}")
    names = sorted(config.schedules)
    name = args.schedule or (names[0] if len(names) == 1 else None)
    if name is None:
        return _fail(2, f"{path} has several schedules; pick one with --schedule: {names}")
    if name not in config.schedules:
        return _fail(2, f"no schedule {name!r} in {path} (there are: {', '.join(names)})")
    schedule = config.schedules[name]
    at: datetime = args.at if args.at is not None else datetime.now(UTC)
    if at.tzinfo is None:
        at = wall_to_instant(at, schedule.tz)

    def local(moment: datetime | None) -> str | None:
        return None if moment is None else moment.astimezone(schedule.tz).isoformat()

    people = on_call(schedule, at)
    if args.json:
        answer = {
            "schedule": name,
            "at": local(at),
            "on_call": [
                {"name": p.name, "layer": p.layer, "until": local(p.until)} for p in people
            ],
        }
        print(json.dumps(answer, indent=2))
        return 0
    print(f"{name} at {local(at)}:")
    if not people:
        print("  nobody is on call")
    for i, person in enumerate(people, 1):
        until = local(person.until) or "(no change within 400 days)"
        print(f"  {i}. {person.name} ({person.layer}) until {until}")
    return 0
