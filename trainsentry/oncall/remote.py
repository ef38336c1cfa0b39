"""`trainsentry oncall override add|list|remove`: run-time overrides and swaps through the
gateway's API (`/api/v1/oncall/overrides`), which stores them with who and when; and
`trainsentry oncall feed`: each schedule's calendar subscription URL (`/api/v1/oncall/feeds`).

The API token comes from TRAINSENTRY_API_TOKEN; the gateway from --gateway or
TRAINSENTRY_GATEWAY_URL (default http://127.0.0.1:9095). Exit codes: 0 done, 1 the gateway
refused (the reason names the field) or could not be reached, 2 bad arguments (also a
malformed gateway URL), 3 no such override.
"""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="override_command", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="add an override (or, with --replaces, a swap)")
    add.add_argument("--schedule", required=True, metavar="NAME")
    add.add_argument("--who", required=True, metavar="PERSON", help="who takes the pager")
    add.add_argument("--replaces", metavar="PERSON", help="a swap: WHO takes this person's shifts")
    add.add_argument("--start", required=True, metavar="ISO8601", help="local time or offset")
    add.add_argument("--end", required=True, metavar="ISO8601")
    add.add_argument("--reason", default="", help="why (kept with it)")
    listing = sub.add_parser("list", help="the overrides and swaps in force")
    listing.add_argument("--schedule", metavar="NAME")
    listing.add_argument("--removed", action="store_true", help="the removed ones too")
    remove = sub.add_parser("remove", help="remove an override or swap by its id")
    remove.add_argument("change_id", type=int, metavar="ID")
    for one in (add, listing, remove):
        one.add_argument("--by", default=None, help="who does it (default: your user name)")
        one.add_argument("--gateway", default=None, metavar="URL", help="the gateway's URL")
        one.add_argument("--json", action="store_true", help="print the gateway's answer")


def _line(item: dict[str, Any]) -> str:
    what = f"{item['who']} for {item['replaces']}" if item.get("replaces") else item["who"]
    removed = f" (removed by {item['removed_by']})" if item.get("removed_by") else ""
    return (
        f"#{item['id']} {item['schedule']} {item['kind']} {what} {item['start']} to "
        f"{item['end']} by {item['created_by']}{removed}"
    )


def run(args: argparse.Namespace) -> int:
    from trainsentry.api_client import Answer, call, gateway_base, refused

    base = gateway_base(args.gateway)
    path = "/api/v1/oncall/overrides"
    name = "trainsentry oncall"
    by = args.by or getpass.getuser()
    if args.override_command == "add":
        body = {"schedule": args.schedule, "who": args.who, "start": args.start}
        body |= {"end": args.end, "reason": args.reason, "by": by}
        if args.replaces:
            body |= {"kind": "swap", "replaces": args.replaces}
        answer = call(name, base, "POST", path, json=body)
    elif args.override_command == "list":
        query = {"removed": "true" if args.removed else "false"}
        if args.schedule:
            query["schedule"] = args.schedule
        answer = call(name, base, "GET", path, params=query)
    else:
        answer = call(name, base, "DELETE", f"{path}/{args.change_id}", json={"by": by})
    if not isinstance(answer, Answer):
        return answer
    if answer.status == 404 and args.override_command == "remove":
        print(answer.body.get("error", "no such override"))
        return 3
    if answer.status not in (200, 201):
        return refused(answer)
    result = answer.body
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.override_command == "list":
        for item in result["items"]:
            print(_line(item))
        if not result["items"]:
            print("no overrides or swaps")
    else:
        print(("removed " if args.override_command == "remove" else "added ") + _line(result))
    return 0


def add_feed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedule", metavar="NAME", help="this schedule only")
    parser.add_argument("--gateway", default=None, metavar="URL", help="the gateway's URL")
    parser.add_argument("--json", action="store_true", help="print the gateway's answer")


def run_feed(args: argparse.Namespace) -> int:
    """Prints `SCHEDULE URL` per schedule: the URL a calendar app subscribes to, with its
    key (shown only to a caller with the API token). Exit 3: no such schedule."""
    from trainsentry.api_client import Answer, call, gateway_base, refused

    base = gateway_base(args.gateway)
    answer = call("trainsentry oncall", base, "GET", "/api/v1/oncall/feeds")
    if not isinstance(answer, Answer):
        return answer
    if answer.status != 200:
        return refused(answer)
    feeds = [f for f in answer.body["feeds"] if args.schedule in (None, f["schedule"])]
    if args.schedule is not None and not feeds:
        print(f"no schedule {args.schedule!r}")
        return 3
    if args.json:
        print(json.dumps({"feeds": feeds}, indent=2))
        return 0
    for feed in feeds:
        print(f"{feed['schedule']} {base}{feed['path']}")  # the URL the CLI reached it by
    return 0
