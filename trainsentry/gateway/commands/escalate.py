"""`trainsentry escalate ID`: call the next step of an alert's phone escalation now."""

from __future__ import annotations

import argparse
import getpass
import json

HELP = "escalate an alert now: call the next step of its phone escalation at once"
DESCRIPTION = """\
Calls the next step of alert ID's running phone escalation now, through the gateway's API
(POST /api/v1/alerts/ID/escalate); the step after it follows its wait from now. Who asked is
kept in the alert's history (an `escalated` event).

The API token comes from TRAINSENTRY_API_TOKEN; the gateway from --gateway or
TRAINSENTRY_GATEWAY_URL (default http://127.0.0.1:9095).

Exit codes: 0 escalated, 1 the gateway refused (e.g. the escalation was acknowledged or has
ended: HTTP 409) or could not be reached, 2 bad arguments (also a malformed gateway URL),
3 no such alert.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("alert_id", type=int, metavar="ID", help="the alert's id (from the card)")
    parser.add_argument("--by", default=None, help="who escalates (default: your user name)")
    parser.add_argument("--gateway", default=None, metavar="URL", help="the gateway's base URL")
    parser.add_argument("--json", action="store_true", help="print the gateway's answer as JSON")


def run(args: argparse.Namespace) -> int:
    from trainsentry.api_client import Answer, call, gateway_base, refused

    body = {"by": args.by or getpass.getuser()}
    path = f"/api/v1/alerts/{args.alert_id}/escalate"
    answer = call("trainsentry escalate", gateway_base(args.gateway), "POST", path, json=body)
    if not isinstance(answer, Answer):
        return answer
    if answer.status == 404:
        print(answer.body.get("error", f"no alert {args.alert_id}"))
        return 3
    if answer.status != 200:
        return refused(answer)
    result = answer.body
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        people = ", ".join(f"{c['person']} ({c['layer']})" for c in result["calls"]) or "nobody"
        print(f"alert {result['alert_id']} escalated by {result['escalated_by']}: calling {people}")
    return 0
