"""Probe stand-ins for gateway tests: each rank's `/dump` served over loopback HTTP with a
synthetic Flight Recorder dump of one scenario (`trainsentry.diagnostics.synthetic`)."""

from __future__ import annotations

import json

from aiohttp import web


async def start_dump_probes(
    world: int, *, scenario: str, culprit: int, entries: int, token: str | None = None
) -> list[web.AppRunner]:
    """One server per rank answering `/dump` (401 without `Bearer <token>` when a token is
    given) with `X-Trainsentry-Rank`; clean them up with `runner.cleanup()`."""
    from trainsentry.diagnostics.synthetic import make_dump

    runners = []
    for rank in range(world):
        dump = json.dumps(make_dump(rank, world, entries, scenario=scenario, culprit=culprit))

        async def serve(
            request: web.Request, dump: bytes = dump.encode(), rank: int = rank
        ) -> web.Response:
            if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
                return web.Response(status=401)
            return web.Response(body=dump, headers={"X-Trainsentry-Rank": str(rank)})

        app = web.Application()
        app.router.add_get("/dump", serve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
    return runners


def addresses(runners: list[web.AppRunner]) -> list[str]:
    """The `ip:port` of each runner, in rank order."""
    return [f"127.0.0.1:{runner.addresses[0][1]}" for runner in runners]
