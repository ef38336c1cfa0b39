"""Which endpoint needs which token, and what an unset token means (docs/gateway.md, "Who may
call what"), against the real gateway process listening on every interface (issue 19)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.raw_http import raw_request
from tests.support.realservers import RunningServer, start_server
from tests.support.webhook_factory import encode, make_alert, make_body

WEBHOOK = "/api/v1/alertmanager"


def gateway_on_all_interfaces(tmp_path: Path, env: Mapping[str, str]) -> RunningServer:
    def argv(port: int, _workdir: Path) -> list[str]:
        return [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"0.0.0.0:{port}",
                "--db", f"sqlite:///{tmp_path / 'store.db'}"]  # fmt: skip

    unset = {"TRAINSENTRY_WEBHOOK_TOKEN": "", "TRAINSENTRY_API_TOKEN": ""}
    return start_server(tmp_path, "gateway", argv, ready_path="/readyz", env={**unset, **env})


def warnings(server: RunningServer) -> list[str]:
    return [line for line in server.logs().splitlines() if "level=warning" in line]


def bearer(token: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}")]


def test_no_token_on_all_interfaces_warns_for_each_open_group(tmp_path: Path) -> None:
    with gateway_on_all_interfaces(tmp_path, {}) as gateway:
        body = encode(make_body([make_alert()]))
        assert raw_request(gateway.port, "POST", WEBHOOK, [], body).status == 200
        assert raw_request(gateway.port, "GET", "/api/v1/alerts").status == 200
        assert raw_request(gateway.port, "POST", "/api/v1/alerts/1/ack", [], b"{}").status == 403
        open_lines = [line for line in warnings(gateway) if "auth open" in line]
        assert len(open_lines) == 2, warnings(gateway)
        assert "POST /api/v1/alertmanager" in open_lines[0]
        assert "TRAINSENTRY_WEBHOOK_TOKEN" in open_lines[0]
        assert "GET /api/v1/alerts" in open_lines[1]
        assert "TRAINSENTRY_API_TOKEN" in open_lines[1]


def test_webhook_token_alone_also_guards_reads_and_a_trailing_newline_is_stripped(
    tmp_path: Path,
) -> None:
    # A Secret made with `echo tok > file; kubectl create secret --from-file` ends in "\n".
    with gateway_on_all_interfaces(tmp_path, {"TRAINSENTRY_WEBHOOK_TOKEN": "tok-1\n"}) as gateway:
        body = encode(make_body([make_alert()]))
        assert raw_request(gateway.port, "POST", WEBHOOK, bearer("tok-1"), body).status == 200
        assert raw_request(gateway.port, "POST", WEBHOOK, [], body).status == 401
        assert raw_request(gateway.port, "GET", "/api/v1/alerts").status == 401
        answer = raw_request(gateway.port, "GET", "/api/v1/alerts", bearer("tok-1"))
        assert answer.status == 200 and len(json.loads(answer.body)["items"]) == 1
        assert not [line for line in warnings(gateway) if "auth open" in line]


def test_api_token_with_whitespace_guards_reads_apart_from_the_webhook_token(
    tmp_path: Path,
) -> None:
    env = {"TRAINSENTRY_WEBHOOK_TOKEN": "hook-1", "TRAINSENTRY_API_TOKEN": "  api-1\r\n"}
    with gateway_on_all_interfaces(tmp_path, env) as gateway:
        assert raw_request(gateway.port, "GET", "/api/v1/alerts", bearer("hook-1")).status == 401
        assert raw_request(gateway.port, "GET", "/api/v1/alerts", bearer("api-1")).status == 200
        assert raw_request(gateway.port, "GET", "/api/v1/notifications").status == 401


def test_only_the_webhook_open_warns_only_for_the_webhook(tmp_path: Path) -> None:
    with gateway_on_all_interfaces(tmp_path, {"TRAINSENTRY_API_TOKEN": "api-1"}) as gateway:
        assert raw_request(gateway.port, "GET", "/api/v1/alerts").status == 401
        open_lines = [line for line in warnings(gateway) if "auth open" in line]
        assert len(open_lines) == 1 and "webhook intake" in open_lines[0], open_lines
