"""The console of the real `trainsentry gateway` process against hostile requests (issue 32
findings 6, 9 and 12), over raw sockets where a client would refuse to send the bytes:

- a session, CSRF or sign-in cookie holding bytes no cookie of ours has (a cookie planted
  from a sibling domain) is no cookie: the pages work, the sign-in page opens;
- an `Origin` that is not a URL, a form whose charset is unknown, a form that is not UTF-8,
  a multipart form without its boundary: 400, on the sign-in form and on the actions;
- sign-out ends the session on the server: the cookie copied before it no longer signs in,
  after a restart too; sign-out needs the CSRF token and this site's origin;
- `?done=` shows only the console's own fixed messages, never the text of the link.

Each request is followed by a look at what the gateway logged meanwhile: no ERROR line and
no traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.support.gateway_process import start_gateway
from tests.support.raw_http import RawResponse, raw_request
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body

pytestmark = pytest.mark.e2e

TOKEN = "console-hostile-token"
FORM = ("Content-Type", "application/x-www-form-urlencoded")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp_path = tmp_path_factory.mktemp("console-hostile")
    with start_gateway(tmp_path, f"sqlite:///{tmp_path / 'store.db'}", token=TOKEN) as server:
        auth = [("Authorization", f"Bearer {TOKEN}")]
        body = encode(make_body([make_alert(1, labels={"priority": "P1"})]))
        assert raw_request(server.port, "POST", "/api/v1/alertmanager", auth, body).status == 200
        yield server


class Logged:
    """What the gateway logs from here on."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.start = len(server.logs())

    def check(self) -> None:
        logs = self.server.logs()[self.start :]
        assert "Traceback" not in logs and "level=error" not in logs, logs[-3000:]


def sign_in(server: RunningServer, name: str = "erin") -> dict[str, str]:
    """The cookies of a signed-in browser: the sign-in page's nonce, then the form."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/ui/login")
    page = conn.getresponse()
    html = page.read().decode()
    jar = _set_cookies(page.headers.get_all("Set-Cookie") or [])
    nonce = re.search(r'name="csrf" value="([^"]+)"', html)
    assert nonce is not None
    form = f"csrf={nonce.group(1)}&name={name}&token={TOKEN}&next=/ui/"
    headers = {"Cookie": _cookie_header(jar), "Content-Type": FORM[1]}
    conn.request("POST", "/ui/login", body=form, headers=headers)
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 303, answer.status
    jar.update(_set_cookies(answer.headers.get_all("Set-Cookie") or []))
    jar.pop("ts_login", None)
    conn.close()
    assert "ts_session" in jar and "ts_csrf" in jar
    return jar


def _set_cookies(headers: list[str]) -> dict[str, str]:
    found = {}
    for header in headers:
        name, _, rest = header.partition("=")
        value = rest.split(";", 1)[0]
        if value and "max-age=0" not in header.lower():
            found[name.strip()] = value
    return found


def _cookie_header(jar: dict[str, str]) -> str:
    return "; ".join(f"{name}={value}" for name, value in jar.items())


def get(server: RunningServer, path: str, jar: dict[str, str] | None = None) -> RawResponse:
    headers = [("Cookie", _cookie_header(jar))] if jar else []
    return raw_request(server.port, "GET", path, headers)


def csrf_of(page: bytes) -> str:
    found = re.search(rb'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1).decode()


ODD = [b"\xff\xfe", b"\xc3\xa9t\xc3\xa9", b"a\x80b", "令牌".encode()]


@pytest.mark.parametrize("odd", ODD)
def test_a_cookie_with_odd_bytes_is_no_cookie(gateway: RunningServer, odd: bytes) -> None:
    logged = Logged(gateway)
    for name in (b"ts_session", b"ts_csrf", b"ts_login"):
        cookie = [(b"Cookie", name + b"=" + odd)]
        answer = raw_request(gateway.port, "GET", "/ui/", cookie)
        assert answer.status == 303 and answer.headers["location"].startswith("/ui/login")
        assert raw_request(gateway.port, "GET", "/ui/login", cookie).status == 200
    # a signed-in browser that was given a junk cookie beside its own keeps working
    jar = sign_in(gateway)
    for name in (b"ts_csrf", b"ts_other"):
        cookie = [(b"Cookie", _cookie_header(jar).encode() + b"; " + name + b"=" + odd)]
        answer = raw_request(gateway.port, "GET", "/ui/alerts/1", cookie)
        assert answer.status == 200, answer
    # the sign-in form posted with a junk nonce cookie: refused as an expired form
    form = f"csrf=x&name=eve&token={TOKEN}".encode()
    cookie = [(b"Cookie", b"ts_login=" + odd), FORM]
    assert raw_request(gateway.port, "POST", "/ui/login", cookie, form).status == 403
    logged.check()


BAD_FORMS = {
    "origin not a URL": ([("Origin", "http://[")], b"comment=x", "Origin"),
    "unknown charset": ([("Content-Type", f"{FORM[1]}; charset=nope")], b"comment=x", "form"),
    "not UTF-8": ([FORM], b"comment=\xff\xfe", "form"),
    "multipart without boundary": ([("Content-Type", "multipart/form-data")], b"x", "form"),
}


@pytest.mark.parametrize("case", sorted(BAD_FORMS))
def test_a_bad_form_or_origin_is_400(gateway: RunningServer, case: str) -> None:
    headers, body, says = BAD_FORMS[case]
    logged = Logged(gateway)
    # the sign-in form
    nonce = "n" * 32
    cookie = ("Cookie", f"ts_login={nonce}")
    extra = [h for h in headers if h[0] != "Content-Type"] or []
    kind = [h for h in headers if h[0] == "Content-Type"] or [FORM]
    login = f"csrf={nonce}&name=eve&token={TOKEN}&".encode() + body
    answer = raw_request(gateway.port, "POST", "/ui/login", [cookie, *extra, *kind], login)
    assert answer.status == 400 and says.encode() in answer.body, (case, answer)
    # an action of a signed-in user, with the right CSRF token
    jar = sign_in(gateway)
    csrf = csrf_of(get(gateway, "/ui/alerts/1", jar).body)
    action = f"csrf={csrf}&".encode() + body
    session = ("Cookie", _cookie_header(jar))
    answer = raw_request(gateway.port, "POST", "/ui/alerts/1/ack", [session, *extra, *kind], action)
    assert answer.status == 400 and says.encode() in answer.body, (case, answer)
    logged.check()
    auth = [("Authorization", f"Bearer {TOKEN}")]
    detail = raw_request(gateway.port, "GET", "/api/v1/alerts/1", auth)
    assert b'"acked_by": null' in detail.body  # nothing was acknowledged


def logout(
    server: RunningServer, jar: dict[str, str], csrf: str | None, origin: str | None = None
) -> RawResponse:
    headers = [("Cookie", _cookie_header(jar)), FORM]
    if origin is not None:
        headers.append(("Origin", origin))
    body = f"csrf={csrf}".encode() if csrf is not None else b""
    return raw_request(server.port, "POST", "/ui/logout", headers, body)


def test_sign_out_ends_the_session_on_the_server(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    with start_gateway(tmp_path / "a", db, token=TOKEN) as gateway:
        logged = Logged(gateway)
        jar = sign_in(gateway, "frank")
        copied = dict(jar)  # what an attacker copied from the browser
        page = get(gateway, "/ui/", jar)
        assert page.status == 200 and b"frank" in page.body
        csrf = csrf_of(page.body)
        # sign-out needs the CSRF token and this site's origin, like every other form
        assert logout(gateway, jar, None).status == 403
        assert logout(gateway, jar, "forged").status == 403
        assert logout(gateway, jar, csrf, origin="https://evil.example").status == 403
        assert get(gateway, "/ui/", copied).status == 200  # none of them signed out
        answer = logout(gateway, jar, csrf, origin="http://127.0.0.1")  # raw_request's Host
        assert answer.status == 303 and answer.headers["location"] == "/ui/login"
        # the copied cookie is still signed and unexpired, but the session is over
        answer = get(gateway, "/ui/", copied)
        assert answer.status == 303 and answer.headers["location"].startswith("/ui/login")
        assert get(gateway, "/ui/fragments/now", copied).status == 401
        # another sign-in is another session
        assert get(gateway, "/ui/", sign_in(gateway, "frank")).status == 200
        logged.check()
    with start_gateway(tmp_path / "b", db, token=TOKEN) as gateway:  # restarted
        assert get(gateway, "/ui/", copied).status == 303


def test_done_shows_only_the_consoles_own_messages(gateway: RunningServer) -> None:
    jar = sign_in(gateway)
    lure = "Your session expired: call +1-555-0100 now"
    for path in ("/ui/", "/ui/alerts/1"):
        page = get(
            gateway, f"{path}?done=Your%20session%20expired%3A%20call%20%2B1-555-0100%20now", jar
        )
        assert page.status == 200 and lure.encode() not in page.body
        assert b'class="notice"' not in page.body
    page = get(gateway, "/ui/alerts/1?done=acked", jar)
    assert b'class="notice"' in page.body and b"Acknowledged" in page.body


NEXT_ELSEWHERE = [
    "https://evil.example/ui/",
    "//evil.example/ui/",
    "/\\evil.example",
    "/ui-not/",
    "javascript:alert(1)",
]


@pytest.mark.parametrize("target", NEXT_ELSEWHERE)
def test_sign_in_goes_back_only_to_a_console_page(gateway: RunningServer, target: str) -> None:
    """Held up in the red team (kept so): `next=` leads to a path of the console only."""
    page = get(gateway, "/ui/login?" + urlencode({"next": target}))
    assert page.status == 200 and b'name="next" value="/ui/"' in page.body
    nonce = csrf_of(page.body)
    form = urlencode({"csrf": nonce, "name": "erin", "token": TOKEN, "next": target})
    cookie = ("Cookie", f"ts_login={nonce}")
    answer = raw_request(gateway.port, "POST", "/ui/login", [cookie, FORM], form.encode())
    assert answer.status == 303 and answer.headers["location"] == "/ui/", answer.headers


def test_every_page_carries_the_security_headers(gateway: RunningServer) -> None:
    """Held up in the red team (kept so): the CSP forbids framing and other origins on the
    pages, the error pages and the live fragments alike."""
    jar = sign_in(gateway)
    for path, status in (
        ("/ui/", 200),
        ("/ui/login", 200),
        ("/ui/alerts/1", 200),
        ("/ui/fragments/now", 200),
        ("/ui/history?days=3", 400),
        ("/ui/alerts/999", 404),
    ):
        answer = get(gateway, path, jar)
        assert answer.status == status, (path, answer.status)
        csp = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, path
        assert answer.headers.get("x-content-type-options") == "nosniff", path
