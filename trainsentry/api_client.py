"""How the CLI commands talk to a running gateway's API (`trainsentry ack`, `escalate`,
`maintenance`, `oncall override`, `node uncordon`): one request, its failures as the
commands' exit codes.

The gateway is `--gateway` or TRAINSENTRY_GATEWAY_URL (default http://127.0.0.1:9095); the
token is TRAINSENTRY_API_TOKEN, sent as a bearer token when set. Invariants: a request never
waits more than `TIMEOUT` seconds; an unusable URL is exit code 2 (with the command's name on
stderr), an unreachable gateway exit code 1; an answer that is not a JSON object is carried as
`{"error": <its first 200 characters>}`, so callers can always read `body.get("error")`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

DEFAULT_GATEWAY = "http://127.0.0.1:9095"
TIMEOUT = 15.0


@dataclass(frozen=True)
class Answer:
    """The gateway's answer: its HTTP status and its JSON object."""

    status: int
    body: dict[str, Any]


def gateway_base(flag: str | None) -> str:
    """The gateway's base URL, without a trailing slash."""
    return (flag or os.environ.get("TRAINSENTRY_GATEWAY_URL", DEFAULT_GATEWAY)).rstrip("/")


def call(
    command: str,
    base: str,
    method: str,
    path: str,
    *,
    json: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
) -> Answer | int:
    """`method` `base + path`; the Answer, or the exit code when no answer came."""
    import httpx

    token = os.environ.get("TRAINSENTRY_API_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(
            method, base + path, json=json, params=params, headers=headers, timeout=TIMEOUT
        )
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # InvalidURL: no HTTPError
        print(f"{command}: not a usable gateway URL: {base}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"could not reach the gateway at {base}: {exc}")
        return 1
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"error": response.text[:200]}
    return Answer(response.status_code, body)


def refused(answer: Answer) -> int:
    """Says the gateway refused, with its reason; exit code 1."""
    print(f"the gateway refused: HTTP {answer.status}: {answer.body.get('error', answer.body)}")
    return 1
