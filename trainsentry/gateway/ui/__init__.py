"""The incident console at `/ui/` (docs/console.md): server-rendered pages of what is open
now (incidents, their alerts inside), one incident, one alert with its diagnosis, history
by incident, a job's hardware, who is on call (and its overrides), the silences and
maintenance windows, and the nodes (health, cordons), with live updates by
server-sent events and the ack and silence actions of the API.

`add_ui_routes` is all the gateway's api/app.py calls. Templates (jinja2, autoescaped: labels
and annotations are attacker-controlled) and the one script and stylesheet ship in this
package; nothing is fetched from another origin and nothing is built.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import jinja2
from aiohttp import web

from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.ui import (
    handlers,
    incident_pages,
    node_pages,
    oncall_pages,
    pages,
    signin,
    window_pages,
)
from trainsentry.gateway.ui.feed import ChangeFeed
from trainsentry.gateway.ui.render_cache import RenderCache
from trainsentry.store.console import change_marker

HERE = Path(__file__).resolve().parent


def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["hhmm"] = lambda t: t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else ""
    return env


def add_ui_routes(
    app: web.Application, *, feed_interval: float = 1.0, now_reuse_s: float = 1.0
) -> None:
    async def read_marker() -> tuple[int, int, int]:
        async with app[GATEWAY_KEY].engine.connect() as conn:
            return await change_marker(conn)

    feed = ChangeFeed(read_marker, interval=feed_interval)
    app[handlers.FEED_KEY] = feed
    app[pages.TEMPLATES_KEY] = templates()
    app[handlers.NOW_CACHE_KEY] = RenderCache(reuse_s=now_reuse_s)

    async def close_feed(_app: web.Application) -> None:
        await feed.close()

    app.on_shutdown.append(close_feed)
    router = app.router
    router.add_get("/ui", _redirect)
    router.add_get("/ui/", handlers.now_page)
    router.add_get("/ui/fragments/now", handlers.now_fragment)
    router.add_get("/ui/events", handlers.events)
    router.add_get("/ui/incidents/{incident_id}", incident_pages.incident_page)
    router.add_get("/ui/fragments/incidents/{incident_id}", incident_pages.incident_fragment)
    router.add_post("/ui/incidents/{incident_id}/{action}", incident_pages.post_incident_action)
    router.add_post("/ui/jobs/ack", incident_pages.post_job_ack)
    router.add_get("/ui/alerts/{alert_id}", handlers.alert_page)
    router.add_get("/ui/fragments/alerts/{alert_id}", handlers.alert_fragment)
    router.add_post("/ui/alerts/{alert_id}/{action}", handlers.post_action)
    router.add_post("/ui/maintenance/{window_id}/end", handlers.post_end_window)
    router.add_get("/ui/history", handlers.history_page)
    router.add_get("/ui/oncall", oncall_pages.oncall_page)
    router.add_post("/ui/oncall/overrides", oncall_pages.post_override)
    router.add_post("/ui/oncall/overrides/{change_id}/remove", oncall_pages.post_remove_override)
    router.add_get("/ui/silences", window_pages.silences_page)
    router.add_post("/ui/silences/windows", window_pages.post_window)
    router.add_get("/ui/nodes", node_pages.nodes)
    router.add_post("/ui/nodes/{node}/uncordon", node_pages.post_uncordon)
    router.add_post("/ui/nodes/{node}/{decision}", node_pages.post_decision)
    router.add_get("/ui/job", handlers.job_page)
    router.add_get("/ui/login", signin.login_page)
    router.add_post("/ui/login", signin.login_post)
    router.add_post("/ui/logout", handlers.logout_post)
    router.add_static("/ui/static", HERE / "static", append_version=False)


async def _redirect(_request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently("/ui/")
