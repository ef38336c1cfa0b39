"""Requests the store could never keep are refused at the edge with 400 and the field named,
the same on SQLite and the real PostgreSQL (issue 19 finding 11): a 503 would have
Alertmanager retry them forever and count toward the store-unavailable alert."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_process import start_gateway
from tests.support.raw_http import RawResponse, raw_request
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body

TOKEN = "s3cret-token"
AUTH = [("Authorization", f"Bearer {TOKEN}")]
WEBHOOK = "/api/v1/alertmanager"


@pytest.fixture
def gateway(tmp_path: Path, db_url: str) -> Iterator[RunningServer]:
    with start_gateway(tmp_path, db_url, token=TOKEN) as server:
        yield server
        assert "Traceback" not in server.logs(), server.logs()[-3000:]


def refused(answer: RawResponse, field: str) -> None:
    assert answer.status == 400, answer
    text = answer.body.decode()
    assert field in text, text


def test_truncated_alerts_beyond_the_column_is_400(gateway: RunningServer) -> None:
    for count in (2**31, 2**63, 2**64, 10**30):
        body = make_body([make_alert()])
        body["truncatedAlerts"] = count
        refused(raw_request(gateway.port, "POST", WEBHOOK, AUTH, encode(body)), "truncatedAlerts")
    body = make_body([make_alert()])
    body["truncatedAlerts"] = 2**31 - 1  # PostgreSQL's INTEGER, the smaller column: accepted
    assert raw_request(gateway.port, "POST", WEBHOOK, AUTH, encode(body)).status == 200


@pytest.mark.parametrize(("escaped", "why"), [("\\u0000", "NUL"), ("\\ud800", "surrogate")])
def test_nul_and_lone_surrogates_in_labels_and_annotations_are_400_naming_the_field(
    gateway: RunningServer, escaped: str, why: str
) -> None:
    for where in ("labels", "annotations"):
        body = make_body([make_alert()])
        body["alerts"][0][where]["team"] = "a" + "\x01MARK\x01" + "b"
        raw = encode(body).replace(b"\\u0001MARK\\u0001", escaped.encode())
        answer = raw_request(gateway.port, "POST", WEBHOOK, AUTH, raw)
        refused(answer, f"alerts.0.{where}.team")
        assert why in answer.body.decode()


@pytest.mark.parametrize("escaped", ["\\u0000", "\\ud800", "x\\udfff", "\\u0000\\ud83d"])
def test_nul_or_lone_surrogate_in_the_ack_by_is_400(gateway: RunningServer, escaped: str) -> None:
    stored = raw_request(gateway.port, "POST", WEBHOOK, AUTH, encode(make_body([make_alert()])))
    assert stored.status == 200
    body = b'{"by": "alice' + escaped.encode() + b'"}'
    refused(raw_request(gateway.port, "POST", "/api/v1/alerts/1/ack", AUTH, body), "'by'")
    detail = json.loads(raw_request(gateway.port, "GET", "/api/v1/alerts/1", AUTH).body)
    assert "alice" not in json.dumps(detail)  # nothing was stored
    ok = raw_request(gateway.port, "POST", "/api/v1/alerts/1/ack", AUTH, b'{"by": "alice"}')
    assert ok.status == 200, ok


@pytest.mark.parametrize("value", ["%00", "a%00b", "%ED%A0%80", "%ff", "%C0%80"])
def test_nul_or_bad_bytes_in_query_text_is_400(gateway: RunningServer, value: str) -> None:
    for path, name in (("/api/v1/alerts", "job"), ("/api/v1/notifications", "channel")):
        answer = raw_request(gateway.port, "GET", f"{path}?{name}={value}", AUTH)
        assert answer.status in (200, 400), answer
        if answer.status == 200:  # a value the store can hold (yarl kept the escape as text)
            assert json.loads(answer.body)["items"] == []
        else:
            refused(answer, name)
    refused(raw_request(gateway.port, "GET", "/api/v1/alerts?job=%00", AUTH), "job")
