"""The on-call endpoints over loopback HTTP: who is on call (shaped like the CLI), the .ics
feed, run-time overrides, and bad input answered 400/404 with the field named."""

from __future__ import annotations

from pathlib import Path

import icalendar

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.oncall_gateway import START, call, start
from tests.support.receiver import Receiver


async def test_who_is_on_call_and_the_feed(db_url: str, receiver: Receiver, tmp_path: Path) -> None:
    server = await start(db_url, receiver, Clock(START), tmp_path)
    try:
        status, answer = await call(server, "GET", "/api/v1/oncall")
        assert status == 200
        assert answer == {
            "schedules": [
                {
                    "schedule": "gpu-infra",
                    "at": "2026-11-20T04:00:00+01:00",
                    "on_call": [
                        {"name": "alice", "layer": "primary", "until": "2026-11-23T09:00:00+01:00"},
                        {"name": "bob", "layer": "backup", "until": None},
                    ],
                }
            ]
        }
        # one schedule, at a local time: the CLI's shape
        status, answer = await call(
            server, "GET", "/api/v1/oncall?schedule=gpu-infra&at=2026-11-23T09:00"
        )
        assert status == 200 and answer["at"] == "2026-11-23T09:00:00+01:00"
        assert [p["name"] for p in answer["on_call"]] == ["carol", "bob"]
        status, feed = await call(server, "GET", "/api/v1/oncall/gpu-infra.ics?days=14")
        assert status == 200
        calendar = icalendar.Calendar.from_ical(feed)
        events = [(str(e["summary"]), e.decoded("dtstart")) for e in calendar.walk("VEVENT")]
        assert events == [
            ("alice on call (gpu-infra, layer primary)", START.replace(day=16, hour=8)),
            ("carol on call (gpu-infra, layer primary)", START.replace(day=23, hour=8)),
            ("alice on call (gpu-infra, layer primary)", START.replace(day=30, hour=8)),
        ]
        # the read token, as the other read endpoints
        assert (await call(server, "GET", "/api/v1/oncall", token=None))[0] == 401
        assert (await call(server, "GET", "/api/v1/oncall/gpu-infra.ics", token="bad"))[0] == 401
    finally:
        await close_in_process(server)


async def test_bad_input_is_refused_naming_the_field(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    server = await start(db_url, receiver, Clock(START), tmp_path)
    good = {"schedule": "gpu-infra", "who": "carol", "by": "alice"}
    good |= {"start": "2026-11-20T12:00", "end": "2026-11-20T18:00"}
    cases = [
        ("GET", "/api/v1/oncall?schedule=nope", None, 400, "no schedule 'nope'"),
        ("GET", "/api/v1/oncall?at=yesterday", None, 400, "at must be an ISO 8601"),
        ("GET", "/api/v1/oncall?at=2026-11-20T10:00", None, 400, "at needs a UTC offset"),
        ("GET", "/api/v1/oncall/nope.ics", None, 404, "no schedule 'nope'"),
        ("GET", "/api/v1/oncall/gpu-infra.ics?days=0", None, 400, "days must be"),
        ("GET", "/api/v1/oncall/gpu-infra.ics?days=99999999999", None, 400, "days must be"),
        ("GET", "/api/v1/oncall/overrides?removed=maybe", None, 400, "removed must be"),
        ("POST", "/api/v1/oncall/overrides", {**good, "who": "zed"}, 400, "who: unknown person"),
        ("POST", "/api/v1/oncall/overrides", {**good, "schedule": "x"}, 400, "no schedule 'x'"),
        ("POST", "/api/v1/oncall/overrides", {**good, "end": "2026-11-20T11:00"}, 400,
         "end: is not after start"),
        ("POST", "/api/v1/oncall/overrides", {**good, "end": "2026-11-19T11:00"}, 400,
         "end: is not after start"),
        ("POST", "/api/v1/oncall/overrides", {**good, "start": "noon"}, 400,
         "start: not an ISO 8601"),
        ("POST", "/api/v1/oncall/overrides", {**good, "kind": "swap"}, 400,
         "replaces: unknown person"),
        ("POST", "/api/v1/oncall/overrides", {**good, "colour": "red"}, 400,
         "colour: unknown field"),
        ("POST", "/api/v1/oncall/overrides", {**good, "by": ""}, 400, "'by' must be"),
        ("POST", "/api/v1/oncall/overrides", [1], 400, "body must be a JSON object"),
        ("DELETE", "/api/v1/oncall/overrides/abc", {"by": "x"}, 400, "override id must be"),
        ("DELETE", "/api/v1/oncall/overrides/77", {"by": "x"}, 404, "no override 77"),
    ]  # fmt: skip
    try:
        for method, path, body, want_status, want_text in cases:
            status, answer = await call(server, method, path, body)
            assert (status, want_text in answer.get("error", "")) == (want_status, True), (
                path,
                body,
                answer,
            )
        status, _ = await call(server, "POST", "/api/v1/oncall/overrides", good)
        assert status == 201
        overlapping = {**good, "who": "bob", "start": "2026-11-20T17:00", "end": "2026-11-20T19:00"}
        status, answer = await call(server, "POST", "/api/v1/oncall/overrides", overlapping)
        assert status == 400 and answer["error"].startswith("start: overlaps the override of carol")
        # a swap: bob takes alice's primary shifts for a day, keeping the layer's place
        swap = {**good, "kind": "swap", "who": "bob", "replaces": "alice"}
        swap |= {"start": "2026-11-21T00:00", "end": "2026-11-22T00:00"}
        status, answer = await call(server, "POST", "/api/v1/oncall/overrides", swap)
        assert status == 201, answer
        status, answer = await call(
            server, "GET", "/api/v1/oncall?schedule=gpu-infra&at=2026-11-21T12:00"
        )
        assert [(p["name"], p["layer"]) for p in answer["on_call"]] == [("bob", "primary")]
        assert (await call(server, "POST", "/api/v1/oncall/overrides", good, token=None))[0] == 401
    finally:
        await close_in_process(server)


async def test_a_gateway_without_schedules_says_so(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    from aiohttp.test_utils import TestServer
    from pydantic import SecretStr

    from trainsentry.config import GatewaySettings
    from trainsentry.gateway.assemble import create_app

    settings = GatewaySettings(listen="127.0.0.1:0", db=db_url, api_token=SecretStr("api-token"))
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        status, answer = await call(server, "GET", "/api/v1/oncall")
        assert status == 404 and "no oncall: section" in answer["error"]
    finally:
        await close_in_process(server)
