"""The parts of `POST /api/v1/hang-triggers` both trigger ports share: the gateway's port
(api/app.py `receive_hang_trigger`) and the trigger port's process (api/trigger_process.py),
which imports only this, not the gateway. One spelling of each check and each refusal, so
the two ports answer a refused trigger byte for byte the same.

Invariants:
- Memory only: no store, no cluster API, no gateway; `count(label)` is how a refusal is
  counted (the gateway's receipts metric, or the process's tally sent to the gateway).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from trainsentry.alerts import JobRef
from trainsentry.gateway.api.auth import bearer, error_response, unauthorized
from trainsentry.gateway.api.request_body import BodyRejected, read_body
from trainsentry.gateway.stages.hang.trigger import (
    KNOWN_BODY,
    MAX_TRIGGER_BYTES,
    HangTrigger,
    TriggerRejected,
    parse_trigger,
    trigger_token_ok,
)

HANG_TRIGGER_PATH = "/api/v1/hang-triggers"

#: Counts one refusal under a receipts label ("unauthorized", "rejected").
Count = Callable[[str], None]


def triggers_off() -> web.Response:
    return error_response(
        404, "hang triggers are off: this gateway has no hang diagnosis configured"
    )


async def checked_trigger(
    master: str, request: web.Request, count: Count
) -> HangTrigger | web.Response:
    """The request's trigger, once its bearer token, body size, schema and the job's token
    (derived from the `master` probe token) are checked; else the refusal to answer."""
    given = bearer(request)
    if given is None:
        count("unauthorized")
        return unauthorized()
    try:
        trigger = parse_trigger(await read_body(request, MAX_TRIGGER_BYTES))
    except BodyRejected as exc:
        return error_response(exc.status, exc.reason)
    except TriggerRejected as exc:
        count("rejected")
        return error_response(400, str(exc))
    if not trigger_token_ok(given, master, trigger):  # the job's token, or the master
        count("unauthorized")
        return unauthorized()
    return trigger


def not_a_rank(job: JobRef, remote: str | None, count: Count) -> web.Response:
    """The answer to a trigger whose sender is not one of its job's rank hosts."""
    count("unauthorized")
    return error_response(403, f"{remote} is not a rank of TrainingJob {job}")


def known_answer() -> web.Response:
    """200 with the pre-encoded "known" body: the probe stops posting on it."""
    return web.Response(body=KNOWN_BODY, content_type="application/json")
