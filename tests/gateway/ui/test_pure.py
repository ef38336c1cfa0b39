"""The console's pure parts: sessions and CSRF tokens (auth.py), and the views (views.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from trainsentry.config import ConsoleSettings
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.views import BadQuery, age, diagnosis, parse_filters
from trainsentry.notifiers.links import safe_url

NOW = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)
KEY = auth.signing_key(SecretStr("token-a"))


SID = "session-id-0123456789"


def test_a_session_reads_back_until_it_expires_and_not_under_another_key() -> None:
    expires = NOW + timedelta(hours=1)
    cookie = auth.sign_session(KEY, "alice", expires, SID)
    assert auth.read_session(KEY, cookie, NOW) == auth.Session("alice", SID, expires)
    assert auth.read_session(KEY, cookie, NOW + timedelta(hours=1)) is None  # expired
    assert auth.read_session(auth.signing_key(SecretStr("token-b")), cookie, NOW) is None
    payload, _, mac = cookie.partition(".")
    forged = auth.sign_session(KEY, "mallory", NOW + timedelta(days=9), SID).partition(".")[0]
    assert auth.read_session(KEY, f"{forged}.{mac}", NOW) is None
    for junk in ("", ".", "x.y", payload, "a" * 5000, f"{payload}.{mac}x", f"{payload}\udcff"):
        assert auth.read_session(KEY, junk, NOW) is None


def test_a_session_without_an_id_is_none() -> None:
    """Cookies signed before sessions had an id could not be signed out: refused."""
    body = b'{"u":"alice","exp":%d}' % int((NOW + timedelta(hours=1)).timestamp())
    payload = base64.urlsafe_b64encode(body).decode().rstrip("=")
    mac = base64.urlsafe_b64encode(hmac.new(KEY, payload.encode(), hashlib.sha256).digest())
    cookie = f"{payload}.{mac.decode().rstrip('=')}"
    assert auth.read_session(KEY, cookie, NOW) is None
    assert (
        auth.read_session(KEY, auth.sign_session(KEY, "a", NOW + timedelta(hours=1), "short"), NOW)
        is None
    )


def test_csrf_tokens_belong_to_their_nonce() -> None:
    token = auth.csrf_token(KEY, "nonce-1")
    assert auth.csrf_ok(KEY, "nonce-1", token)
    assert not auth.csrf_ok(KEY, "nonce-2", token)
    assert not auth.csrf_ok(KEY, None, token)
    assert not auth.csrf_ok(KEY, "nonce-1", None)
    assert not auth.csrf_ok(KEY, "nonce-1", "")
    assert not auth.csrf_ok(KEY, "nonce-\udcff", token)  # a cookie of bytes no nonce has
    assert not auth.csrf_ok(KEY, "nonce-1", token + "\udcff")


def test_proxies_are_trusted_by_address_only() -> None:
    settings = ConsoleSettings(trusted_proxies=["10.1.0.0/16", "::1"])
    assert auth.proxy_trusted(settings, "10.1.2.3")
    assert auth.proxy_trusted(settings, "::1")
    assert not auth.proxy_trusted(settings, "10.2.0.1")
    assert not auth.proxy_trusted(settings, None)
    assert not auth.proxy_trusted(settings, "not-an-ip")
    assert not auth.proxy_trusted(ConsoleSettings(), "127.0.0.1")
    with pytest.raises(ValueError, match="not an IP address"):
        ConsoleSettings(trusted_proxies=["example.com"])


def test_names_are_printable_and_bounded() -> None:
    assert auth.clean_name("  bob ") == "bob"
    for bad in (None, "", "   ", "a\x00b", "x" * 101, "line\nbreak"):
        assert auth.clean_name(bad) is None


def test_only_web_links_are_drawn() -> None:
    assert safe_url("https://grafana.example/d/x") == "https://grafana.example/d/x"
    for bad in ("javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text/html,x", "//evil",
                "http://", "", None, "ftp://x/y", "lark://applink.feishu.cn/x", "http://[",
                "https://a b", "https://a\x00b"):  # fmt: skip
        assert safe_url(bad) == ""


def test_filters_are_checked() -> None:
    assert parse_filters({"priority": "P1", "job": " llama "}).job == "llama"
    with pytest.raises(BadQuery, match="priority"):
        parse_filters({"priority": "P7"})
    with pytest.raises(BadQuery, match="namespace"):
        parse_filters({"namespace": "x" * 201})


def test_ages() -> None:
    assert age(NOW - timedelta(seconds=5), NOW) == "5 s"
    assert age(NOW - timedelta(minutes=90), NOW) == "1 h 30 min"
    assert age(NOW - timedelta(days=3, hours=2), NOW) == "3 d 2 h"
    assert age(NOW + timedelta(minutes=1), NOW) == "0 s"  # a clock ahead of ours


def test_a_diagnosis_without_a_report_or_with_odd_values_still_draws() -> None:
    drawn = diagnosis({"verdict": "unknown", "summary": "no rank answered", "ranks_failed": ["a"]})
    assert drawn.cells == [] and drawn.failed == ["a"] and drawn.collective == ""
    odd = {
        "verdict": "hang",
        "culprit_ranks": [2, "x"],
        "report": {"ranks": 4, "hang": {"missing_ranks": [2], "arrived_ranks": [0, 1, "y"],
                                        "ranks_without_dump": [3], "op": "all_reduce 4x16",
                                        "seq": 9, "waited_s": "soon"}},
    }  # fmt: skip
    drawn = diagnosis(odd)
    assert [c.state for c in drawn.cells] == ["arrived", "arrived", "culprit", "nodump"]
    assert drawn.collective == "all_reduce #9" and drawn.waited_s is None
    huge = diagnosis({"verdict": "hang", "report": {"ranks": 100_000}})
    assert len(huge.cells) == 4096 and huge.grid_truncated
