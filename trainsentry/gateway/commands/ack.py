"""`trainsentry ack ID`: acknowledge an alert through the gateway's API (stops the calls)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

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

    import httpx

    base = args.gateway or os.environ.get("TRAINSENTRY_GATEWAY_URL", "http://127.0.0.1:9095")
    token = os.environ.get("TRAINSENTRY_API_TOKEN", "")
    body: dict[str, object] = {"by": args.by or getpass.getuser()}
    if args.silence:
        body["silence_minutes"] = args.silence
    if args.comment:
        body["comment"] = args.comment
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(
            f"{base.rstrip('/')}/api/v1/alerts/{args.alert_id}/ack",
            json=body,
            headers=headers,
            timeout=15,
        )
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # InvalidURL: no HTTPError
        print(f"trainsentry ack: not a usable gateway URL: {base}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"could not reach the gateway at {base}: {exc}")
        return 1
    try:
        answer = response.json()
    except ValueError:
        answer = {"error": response.text[:200]}
    if response.status_code == 404:
        print(f"no alert {args.alert_id}")
        return 3
    if response.status_code != 200:
        print(f"the gateway refused: HTTP {response.status_code}: {answer.get('error', answer)}")
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        state = "was already acknowledged by" if answer["already_acked"] else "acknowledged by"
        print(f"alert {answer['alert_id']} {state} {answer['acked_by']}")
        if answer.get("escalation_stopped"):
            print("phone escalation stopped")
        if answer.get("silence_id"):
            print(f"silenced: {answer['silence_id']}")
        elif answer.get("silence_error"):
            print(f"not silenced: {answer['silence_error']}")
    return 0
