"""`trainsentry node uncordon NODE`: make a node cordoned by the gateway schedulable again."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

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
    import httpx

    base = args.gateway or os.environ.get("TRAINSENTRY_GATEWAY_URL", "http://127.0.0.1:9095")
    token = os.environ.get("TRAINSENTRY_API_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(
            f"{base.rstrip('/')}/api/v1/nodes/{args.node}/uncordon",
            json={"by": args.by or getpass.getuser()},
            headers=headers,
            timeout=30,
        )
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        print(f"trainsentry node: not a usable gateway URL: {base}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"could not reach the gateway at {base}: {exc}")
        return 1
    try:
        answer = response.json()
    except ValueError:
        answer = {"error": response.text[:200]}
    if response.status_code != 200:
        print(f"not uncordoned ({response.status_code}): {answer.get('error', answer)}")
        return 1
    print(f"{args.node}: uncordoned by {answer.get('by')}")
    return 0
