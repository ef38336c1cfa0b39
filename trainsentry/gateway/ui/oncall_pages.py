"""The console's On call page (aiohttp handlers, thin; handlers.py wraps them: the viewer,
CSRF, 400/503, the security headers), over the service behind the on-call API
(stages/services/oncall.py `OncallService`, as gateway/api/oncall.py):

- `GET /ui/oncall`: each schedule's answer to who is on call now (as `GET /api/v1/oncall`,
  the stored overrides and swaps merged in) and who is next, its layers, and the overrides
  and swaps not over yet; where no schedule is configured, the inline escalation roster;
- `POST /ui/oncall/overrides`: adds an override or swap through `OncallService.add` (the
  API's `POST /api/v1/oncall/overrides`: the same checks, the same audit line, the same
  handoff re-plan), as the signed-in name;
- `POST /ui/oncall/overrides/{id}/remove`: removes one through `OncallService.remove` (the
  API's `DELETE /api/v1/oncall/overrides/{id}`).

A refused change redraws the page with the service's reason (a 400) and the form as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import urlencode

from aiohttp import web

from trainsentry.gateway.absent import Off
from trainsentry.gateway.access import Target
from trainsentry.gateway.acting import schedule_target
from trainsentry.gateway.api.path_ids import id_problem, parse_id
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.gateway.stages.services.oncall import (
    OncallConfigError,
    OncallService,
    UnknownSchedule,
)
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.acting import acting
from trainsentry.gateway.ui.actions import NOTICES
from trainsentry.gateway.ui.handlers import page
from trainsentry.gateway.ui.model import OncallPage
from trainsentry.gateway.ui.ops_views import oncall_page as oncall_view
from trainsentry.gateway.ui.ops_views import override_request
from trainsentry.gateway.ui.pages import now_of, render
from trainsentry.gateway.ui.views import BadQuery, on_call

log = logging.getLogger("trainsentry.ui")

MAX_REASON = 1000  # as the API's


async def _draw(
    request: web.Request,
    who: auth.Viewer,
    *,
    status: int = 200,
    error: str = "",
    form: Mapping[str, str] | None = None,
) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    service = gateway.oncall
    now = now_of(gateway)
    if isinstance(service, Off) or not service.schedule_names():
        view = OncallPage([], [], on_call(gateway.escalator, now))
    else:
        async with gateway.engine.connect() as conn:
            current = await service.schedules(conn, now)
        stored = await service.listed(None, removed=False)
        view = oncall_view(current, service.config.schedules, stored, service.config.people, now)
    return render(
        request, who, "oncall.html.j2", status=status, view=view, error=error,
        form=dict(form or {}), notice=NOTICES.get(request.query.get("done", "")),
        can_change=not isinstance(service, Off) and who.can_act,
    )  # fmt: skip


@page()
async def oncall_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    return await _draw(request, who)


def _service(request: web.Request, who: auth.Viewer) -> OncallService | web.Response:
    """The gateway's on-call schedules, or the 404 page that says it has none."""
    service = request.app[GATEWAY_KEY].oncall
    if isinstance(service, Off):
        return render(
            request, who, "error.html.j2", status=404,
            message="no on-call schedules: the gateway's configuration has no oncall: section",
        )  # fmt: skip
    return service


@page()
async def post_override(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/oncall/overrides (form fields `csrf`, `schedule`, `kind` override|swap,
    `who`, `replaces` for a swap, `start`, `end` local to the schedule, `reason`)."""
    service = _service(request, who)
    if isinstance(service, web.Response):
        return service

    async def target(fields: Mapping[str, str]) -> Target:  # the schedule it changes
        return schedule_target(fields.get("schedule", "").strip())

    done = await acting(request, who, target)
    if isinstance(done, web.Response):
        return done
    fields = done.fields
    try:
        schedule, body, reason = override_request(fields)
        if len(reason) > MAX_REASON or text_problem(reason) is not None:
            raise BadQuery(f"reason: at most {MAX_REASON} characters that can be stored")
        stored = await service.add(schedule, body, done.actor.audit_name, reason)
    except (BadQuery, UnknownSchedule, OncallConfigError) as exc:
        return await _draw(request, who, status=400, error=str(exc), form=fields)
    log.info(
        "console oncall change added id=%d schedule=%s by=%s via=%s",
        stored.id, schedule, done.actor.name, done.actor.via,
    )  # fmt: skip
    raise web.HTTPSeeOther("/ui/oncall?" + urlencode({"done": "override-added"}))


@page()
async def post_remove_override(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/oncall/overrides/{change_id}/remove (form field `csrf`)."""
    service = _service(request, who)
    if isinstance(service, web.Response):
        return service
    raw = request.match_info["change_id"]
    if (change_id := parse_id(raw)) is None:
        raise BadQuery(id_problem("override"))

    async def target(_fields: Mapping[str, str]) -> Target | None:  # the schedule it changes
        schedule = await service.schedule_of(change_id)
        return None if schedule is None else schedule_target(schedule)

    done = await acting(request, who, target)
    if isinstance(done, web.Response):
        return done
    removed = await service.remove(change_id, done.actor.audit_name)
    if removed is None:
        return render(
            request, who, "error.html.j2", status=404,
            message=f"no override {raw} in force (never added, or removed already)",
        )  # fmt: skip
    log.info("console oncall change removed id=%s by=%s", raw, done.actor.audit_name)
    raise web.HTTPSeeOther("/ui/oncall?" + urlencode({"done": "override-removed"}))
