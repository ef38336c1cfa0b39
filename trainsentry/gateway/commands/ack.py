"""`trainsentry ack ID`: acknowledge an alert through the gateway's API (stops the calls)."""

from __future__ import annotations

import argparse
import getpass

HELP = "acknowledge an alert: stop its phone escalation (and optionally silence it)"
DESCRIPTION = """\
Acknowledges alert ID through the gateway's API (POST /api/v1/alerts/ID/ack): escalation
stops everywhere and the cards show who took it (and --comment, kept with the ack).
--silence also creates an Alertmanager silence for the alert's labels (when the gateway has
an Alertmanager configured).

The API token comes from TRAINSENTRY_API_TOKEN; the gateway from --gateway or
TRAINSENTRY_GATEWAY_URL (default http://127.0.0.1:9095).

Exit codes: 0 acknowledged, 1 the gateway refused or could not be reached, 2 bad arguments
(also a malformed gateway URL), 3 no such alert.
"""


def _duration_minutes(text: str) -> float:
    units = {"m": 1.0, "h": 60.0, "d": 1440.0}
    try:
        if text[-1:] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use 30m, 2h, 1d)") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("alert_id", type=int, metavar="ID", help="the alert's id (from the card)")
    parser.add_argument("--by", default=None, help="who acknowledges (default: your user name)")
    parser.add_argument(
        "--silence", type=_duration_minutes, metavar="DURATION", help="also silence, e.g. 2h"
    )
    parser.add_argument(
        "--comment", default=None, help="a note kept with the ack, shown on the card"
    )
    parser.add_argument("--gateway", default=None, metavar="URL", help="the gateway's base URL")
    parser.add_argument("--json", action="store_true", help="print the gateway's answer as JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from trainsentry.api_client import Answer, call, gateway_base, refused

    body: dict[str, object] = {"by": args.by or getpass.getuser()}
    if args.silence:
        body["silence_minutes"] = args.silence
    if args.comment:
        body["comment"] = args.comment
    base = gateway_base(args.gateway)
    answer = call("trainsentry ack", base, "POST", f"/api/v1/alerts/{args.alert_id}/ack", json=body)
    if not isinstance(answer, Answer):
        return answer
    if answer.status == 404:
        print(f"no alert {args.alert_id}")
        return 3
    if answer.status != 200:
        return refused(answer)
    result = answer.body
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        state = "was already acknowledged by" if result["already_acked"] else "acknowledged by"
        print(f"alert {result['alert_id']} {state} {result['acked_by']}")
        if result.get("escalation_stopped"):
            print("phone escalation stopped")
        if result.get("silence_id"):
            print(f"silenced: {result['silence_id']}")
        elif result.get("silence_error"):
            print(f"not silenced: {result['silence_error']}")
    return 0
