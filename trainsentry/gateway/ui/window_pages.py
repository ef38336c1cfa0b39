"""The console's Silences and windows page (aiohttp handlers, thin; handlers.py wraps them:
the viewer, CSRF, 400/503, the security headers):

- `GET /ui/silences`: the Alertmanager silences the gateway made whose length has not run
  out (its `silenced` events of the last MAX_SILENCE_DAYS days, the newest MAX_SILENCES),
  with their state in Alertmanager (the newest 50 asked, stages/services/silences.py), and its
  maintenance windows not over yet (`MaintenanceService.windows`, as
  `GET /api/v1/maintenance`), each with End now (`POST /ui/maintenance/{id}/end`,
  handlers.py, with `from=silences`);
- `POST /ui/silences/windows`: the form's window, checked by the API's validation
  (`validate_request` with the service's caps): `mode=preview` draws when it would hold and
  which open alerts it would match (the MAX_CHECKED most urgent, the labels a window sees:
  the alert's over its node's place), and stores nothing; `mode=create` makes it through
  `MaintenanceService.create`, the service behind `POST /api/v1/maintenance`, as the
  signed-in name. A refused window redraws the page with the reason (a 400) and the form.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from trainsentry.gateway.absent import Off
from trainsentry.gateway.access import Target
from trainsentry.gateway.acting import window_target
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.policy.maintenance_mutes import match_labels
from trainsentry.gateway.stages.services.maintenance import WindowRejected, validate_request
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.acting import acting
from trainsentry.gateway.ui.actions import NOTICES
from trainsentry.gateway.ui.handlers import page
from trainsentry.gateway.ui.model import Preview
from trainsentry.gateway.ui.ops_views import preview, silences, window_request
from trainsentry.gateway.ui.pages import now_of, render
from trainsentry.gateway.ui.views import BadQuery, windows
from trainsentry.store import console as store
from trainsentry.store.console import AlertRow

log = logging.getLogger("trainsentry.ui")

MAX_SILENCE_DAYS = 30  # the longest silence the console asks for (43,200 minutes)
MAX_SILENCES = 500
MAX_CHECKED = 5000  # open alerts a preview checks, the most urgent first


def _can_make(gateway: Gateway, who: auth.Viewer) -> bool:
    return (
        not isinstance(gateway.maintenance, Off)
        and gateway.settings.api_token is not None
        and who.can_act
    )


async def _draw(
    request: web.Request,
    who: auth.Viewer,
    *,
    status: int = 200,
    error: str = "",
    form: Mapping[str, str] | None = None,
    shown: Preview | None = None,
) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    now = now_of(gateway)
    maintenance = gateway.maintenance
    found = None if isinstance(maintenance, Off) else windows(await maintenance.windows())
    async with gateway.engine.connect() as conn:
        since = now - timedelta(days=MAX_SILENCE_DAYS)
        events = await store.silences_made(conn, since=since, limit=MAX_SILENCES)
    made = silences(events, now)
    states = None
    if made:  # Alertmanager's word on the newest (bounded)
        states = await gateway.ack.silence_states([row.silence_id for row in made])
    return render(
        request, who, "silences.html.j2", status=status, windows=found,
        silences=silences(events, now, states), error=error, form=dict(form or {}), preview=shown,
        notice=NOTICES.get(request.query.get("done", "")), can_make=_can_make(gateway, who),
        asked=states is not None,
    )  # fmt: skip


@page()
async def silences_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    return await _draw(request, who)


async def _open_rows(gateway: Gateway) -> tuple[list[tuple[AlertRow, dict[str, str]]], int]:
    """The most urgent open alerts (MAX_CHECKED) with the labels a window sees, and how
    many are open in all."""
    async with gateway.engine.connect() as conn:
        rows = await store.open_alerts(conn, limit=MAX_CHECKED)
        counts = await store.open_counts(conn, max_choices=0)
    topology = gateway.topology.current()

    def seen(row: AlertRow) -> dict[str, str]:
        place: dict[str, Any] = {"topology": topology.place(row.node)} if topology else {}
        return match_labels(row.labels, place)

    return [(row, seen(row)) for row in rows], sum(counts.by_priority.values())


@page()
async def post_window(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/silences/windows (form fields `csrf`, `mode` preview|create, `matchers` one
    a line, `starts_at`, `ends_at` or `minutes`, `timezone`, `reason`)."""
    gateway = request.app[GATEWAY_KEY]

    async def target(fields: Mapping[str, str]) -> Target:  # the namespaces it would mute
        service, now = gateway.maintenance, now_of(gateway)
        try:
            if isinstance(service, Off):
                raise BadQuery("no maintenance windows here")
            window = validate_request(
                window_request(fields, "-", now), window_id="mw-preview", now=now,
                max_window=service.max_window, max_total=service.max_total,
            )  # fmt: skip
        except (BadQuery, WindowRejected):  # refused below with the reason, as a 400
            return Target("a maintenance window")
        return window_target(window)

    done = await acting(request, who, target)
    if isinstance(done, web.Response):
        return done
    fields = done.fields
    service = gateway.maintenance
    if isinstance(service, Off) or gateway.settings.api_token is None:
        return render(
            request, who, "error.html.j2", status=403,
            message="maintenance windows need the gateway's policy and TRAINSENTRY_API_TOKEN",
        )  # fmt: skip
    now = now_of(gateway)
    try:
        body = window_request(fields, done.actor.audit_name, now)
        window = validate_request(
            body, window_id="mw-preview", now=now,
            max_window=service.max_window, max_total=service.max_total,
        )  # fmt: skip
        if fields.get("mode") == "create":
            made = await service.create(body)
        else:
            rows, total = await _open_rows(gateway)
            shown = preview(window, rows, total, now)
            return await _draw(request, who, form=fields, shown=shown)
    except (BadQuery, WindowRejected) as exc:
        return await _draw(request, who, status=400, error=str(exc), form=fields)
    log.info("console maintenance window created id=%s by=%s", made["id"], done.actor.audit_name)
    raise web.HTTPSeeOther("/ui/silences?" + urlencode({"done": "window-created"}))
