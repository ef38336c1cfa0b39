"""`trainsentry node uncordon NODE`: make a node cordoned by the gateway schedulable again."""

from __future__ import annotations

import argparse
import getpass

HELP = "node remediation: uncordon a node the gateway cordoned"
DESCRIPTION = """\
uncordon NODE: through the gateway's API (POST /api/v1/nodes/NODE/uncordon): the Node's
spec.unschedulable is cleared, an Event is recorded on it, and the gateway logs who asked.
A later recommendation for the node counts only faults after now.

The API token comes from TRAINSENTRY_API_TOKEN; the gateway from --gateway or
TRAINSENTRY_GATEWAY_URL (default http://127.0.0.1:9095).

Exit codes: 0 uncordoned, 1 the gateway refused or could not be reached, 2 bad arguments.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    uncordon = sub.add_parser("uncordon", help="make NODE schedulable again")
    uncordon.add_argument("node", metavar="NODE")
    uncordon.add_argument("--by", default=None, help="who uncordons (default: your user name)")
    uncordon.add_argument("--gateway", default=None, metavar="URL", help="the gateway's base URL")


def run(args: argparse.Namespace) -> int:
    from trainsentry.api_client import Answer, call, gateway_base, refused

    body = {"by": args.by or getpass.getuser()}
    path = f"/api/v1/nodes/{args.node}/uncordon"
    answer = call("trainsentry node", gateway_base(args.gateway), "POST", path, json=body)
    if not isinstance(answer, Answer):
        return answer
    if answer.status != 200:
        return refused(answer)
    print(f"{args.node}: uncordoned by {answer.body.get('by')}")
    return 0
