"""The console's one check of a request that acts (handlers wrapped by `page`, handlers.py):

- `action_form`: a signed-in viewer on a gateway with a token, a bounded form, the CSRF
  token of the viewer's nonce and this site's origin (sign-out needs only this);
- `acting`: that, then who acts (`Viewer.actor`: the proxy's person, or break-glass for a
  session signed in with the token) and whether they may act on the target
  (gateway/acting.py `authorize`, the decision gateway/access.py's `may_act_on`): a 403
  page with the reason when not. Every console handler that changes something calls it
  once, with a coroutine that reads its target from the form or the path:

      @page()
      async def post_thing(request, who):
          done = await acting(request, who, lambda form: incident_target(gateway, id_))
          if isinstance(done, web.Response):
              return done
          ... act as done.actor ...
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from trainsentry.gateway.access import Actor, Target
from trainsentry.gateway.acting import authorize
from trainsentry.gateway.api.auth import read_token
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.pages import read_form, render

MAX_FORM = 16384

TargetOf = Callable[[Mapping[str, str]], Awaitable[Target | None]]


@dataclass(frozen=True, slots=True)
class Acting:
    """An action let through: its form's fields, who acts, on what."""

    fields: dict[str, str]
    actor: Actor
    target: Target


async def action_form(request: web.Request, who: auth.Viewer) -> dict[str, str] | web.Response:
    """The posted form of an action, or the refusal: a signed-in viewer on a gateway with a
    token, a bounded form (BadForm, 413), the CSRF token of the viewer's nonce, and this
    site's origin (auth.BadOrigin when the Origin is not a URL)."""
    gateway = request.app[GATEWAY_KEY]
    token = read_token(gateway.settings)
    if token is None or not who.can_act or who.name is None:
        return render(
            request, who, "error.html.j2", status=403,
            message="actions need TRAINSENTRY_API_TOKEN set on the gateway and a sign-in",
        )  # fmt: skip
    fields = await read_form(request, MAX_FORM)
    given = fields.get(auth.CSRF_FIELD) or request.headers.get(auth.CSRF_HEADER)
    nonce = auth.cookie(request, auth.CSRF_COOKIE)
    if not auth.same_origin(request) or not auth.csrf_ok(auth.signing_key(token), nonce, given):
        return render(
            request, who, "error.html.j2", status=403,
            message="the form's CSRF token is missing or wrong: reload the page and try again",
        )  # fmt: skip
    return fields


async def acting(
    request: web.Request, who: auth.Viewer, target_of: TargetOf
) -> Acting | web.Response:
    """The form (`action_form`), then whether the viewer may act on the target `target_of`
    reads (None: a 404): the action's go-ahead, or the refusal's page (403 with the reason)."""
    fields = await action_form(request, who)
    if isinstance(fields, web.Response):
        return fields
    actor = who.actor
    if actor is None:  # action_form let only a signed-in viewer through
        return render(request, who, "error.html.j2", status=403, message="sign in to act")
    target = await target_of(fields)
    if target is None:
        return render(request, who, "error.html.j2", status=404, message="nothing to act on there")
    decision = authorize(request.app[GATEWAY_KEY], actor, target)
    if not decision.allowed:
        return render(request, who, "error.html.j2", status=403, message=decision.reason)
    return Acting(fields, actor, target)
