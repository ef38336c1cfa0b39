"""Requests the store could never keep are refused at the edge with 400 and the field named,
the same on SQLite and the real PostgreSQL (issue 19 finding 11): a 503 would have
Alertmanager retry them forever and count toward the store-unavailable alert.

One gateway process per database serves the module's tests (a start costs seconds); each
test stores what it needs under names of its own, and no test may leave a traceback in the
gateway's log."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest

from tests.support.gateway_process import start_gateway
from tests.support.pg_databases import give_back_pg_database, take_pg_database
from tests.support.raw_http import RawResponse, raw_request
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body

TOKEN = "s3cret-token"
AUTH = [("Authorization", f"Bearer {TOKEN}")]
WEBHOOK = "/api/v1/alertmanager"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_pool: None
) -> Iterator[RunningServer]:
    """The gateway process of the module's tests on one database: once on SQLite, once on
    the real PostgreSQL."""
    tmp_path = tmp_path_factory.mktemp(f"unstorable-{request.param}")
    if request.param == "sqlite":
        with start_gateway(tmp_path, f"sqlite:///{tmp_path / 'store.db'}", token=TOKEN) as server:
            yield server
        return
    db_url = take_pg_database()
    try:
        with start_gateway(tmp_path, db_url, token=TOKEN) as server:
            yield server
    finally:
        give_back_pg_database(db_url)


@pytest.fixture
def gateway(shared_gateway: RunningServer) -> Iterator[RunningServer]:
    """The shared gateway; what it logged during the test holds no traceback."""
    logged = len(shared_gateway.logs())
    yield shared_gateway
    assert shared_gateway.is_running()
    during = shared_gateway.logs()[logged:]
    assert "Traceback" not in during, during[-3000:]


_alerts = itertools.count(1)  # each test's own alert: index (node, fingerprint) and job


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
    n = next(_alerts)
    alert = make_alert(n, labels={"trainingjob": f"ack-{n}"})
    stored = raw_request(gateway.port, "POST", WEBHOOK, AUTH, encode(make_body([alert])))
    assert stored.status == 200
    (item,) = json.loads(
        raw_request(gateway.port, "GET", f"/api/v1/alerts?job=ack-{n}", AUTH).body
    )["items"]
    ack = f"/api/v1/alerts/{item['id']}/ack"
    body = b'{"by": "alice' + escaped.encode() + b'"}'
    refused(raw_request(gateway.port, "POST", ack, AUTH, body), "'by'")
    detail = json.loads(raw_request(gateway.port, "GET", f"/api/v1/alerts/{item['id']}", AUTH).body)
    assert "alice" not in json.dumps(detail)  # nothing was stored
    ok = raw_request(gateway.port, "POST", ack, AUTH, b'{"by": "alice"}')
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
