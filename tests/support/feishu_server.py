"""A local Feishu that implements what Feishu documents, for contract tests (aiohttp, loopback).

Deliberately independent of trainsentry's code (its own signature check, its own limits):
- custom bot webhooks `POST /open-apis/bot/v2/hook/{token}`: signature (19021), keyword
  (19024), IP allow list (19022), 5/s and 100/min per bot answering 11232, 20 KB body limit,
  card JSON 2.0 shape check;
- `POST /open-apis/auth/v3/tenant_access_token/internal` with expiring tokens, refusing an
  unknown app_id (10003 "invalid param") or a wrong app_secret (10014 "app secret invalid"),
  both HTTP 400; `token_answers` queues answers to give first (rate limits, 5xx);
- frequency limits answered as Feishu's "Rate limits" page documents: HTTP 429 (400 on some
  older APIs), code 99991400 "request trigger frequency limit", with the headers
  `x-ogw-ratelimit-limit` and `x-ogw-ratelimit-reset` (seconds until the window resets);
  sending (`POST im/v1/messages`) and updating (`PATCH im/v1/messages/{id}`) are each limited
  to 50/s and 1000/min per app, as their API pages list (`message_arrivals` records when
  each accepted one arrived, and from which app);
- `POST /open-apis/im/v1/messages` (uuid de-duplication), `PATCH .../messages/{id}/urgent_phone`;
  with `chats` given, a message to a chat the app's bot is not in answers HTTP 400 code
  230002 ("Bot/User can NOT be out of the chat.");
- `PATCH /open-apis/im/v1/messages/{id}` (update a card the app sent) with the limits of
  Feishu's page "更新已发送的消息卡片" (im-v1/message/patch): only an `interactive` message, only
  with the identity (here: the app) that sent it, only a message not recalled (230011), only
  within 14 days of its sending, only a shared card (`config.update_multi: true` in the card
  as sent and in the new one), at most 5 updates a second per message (230020, the IM API's
  frequency-limit code). An unknown message_id answers 230001 "invalid message_id" (Feishu's
  230001 troubleshooting page); the page names no code for the other refusals, so they answer
  230001 with an `ext=` reason, Feishu's form of a parameter error (UPDATE_REFUSED);
- card callbacks as Feishu delivers them (`press` builds the `card.action.trigger` body,
  `callback_request` the request): with the app's encrypt key set, the body is
  `{"encrypt": base64(iv + AES-256-CBC(key = SHA-256(encrypt key), PKCS#7(json)))}` and the
  request carries `X-Lark-Request-Timestamp`, `X-Lark-Request-Nonce` and `X-Lark-Signature`
  = hex SHA-256 of timestamp + nonce + encrypt key + raw body (Feishu's "Encrypt and verify
  requests"); without an encrypt key the body is the plain JSON, unsigned, with the
  verification token in `header.token` as the only proof;
- `POST /open-apis/contact/v3/users/batch_get_id?user_id_type=open_id` with `emails`: the
  `user_list` has one entry per address, with `user_id` only for the known ones (`emails`);
- Sheets: `sheets/query`, `sheets_batch_update` (addSheet), `values_append` and
  `values_batch_update` with range checks, `GET values/{range}`.

`time_scale` shrinks every rate window (0.02 turns 100/min into 100 per 1.2 s) so tests of
the limits run in seconds; the counting logic is the same.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import math
import os
import re
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_BOT_BODY = 20 * 1024
CARD_TEMPLATES = {
    "blue", "wathet", "turquoise", "green", "yellow", "orange", "red", "carmine",
    "violet", "purple", "indigo", "grey", "default",
}  # fmt: skip
INVALID_TOKEN = 99991663
APP_RATE_LIMITED = 99991400
INVALID_PARAM = 10003  # the token endpoint's answer to an unknown app_id
APP_SECRET_INVALID = 10014
RANGE_ERROR = 90202
BAD_PARAMS = 19002  # our stand-in for "params error" (Feishu does not document one code)
INVALID_REQUEST = 230001  # IM: "Your request contains an invalid request parameter, ext=..."
MESSAGE_RECALLED = 230011
MESSAGE_RATE_LIMITED = 230020  # IM: "This operation triggers the frequency limit"
UPDATE_REFUSED = INVALID_REQUEST  # our stand-in for the update limits the page gives no code
CARD_UPDATE_DAYS = 14


@dataclass
class Hook:
    secret: str | None = None
    keyword: str | None = None
    allowed_ips: set[str] | None = None


@dataclass
class Window:
    """Sliding-window counter over several (count, seconds) limits."""

    limits: list[tuple[int, float]]
    times: deque[float] = field(default_factory=deque)

    def admit(self, now: float) -> bool:
        horizon = max(seconds for _, seconds in self.limits)
        while self.times and self.times[0] <= now - horizon:
            self.times.popleft()
        for count, seconds in self.limits:
            if sum(1 for t in self.times if t > now - seconds) >= count:
                return False
        self.times.append(now)
        return True

    def reset_s(self, now: float) -> int:
        """Whole seconds until `admit` would take a request again (at least 1): what Feishu's
        `x-ogw-ratelimit-reset` says ("recovery period for limit, unit: second")."""
        wait = 0.0
        for count, seconds in self.limits:
            recent = [t for t in self.times if t > now - seconds]
            if len(recent) >= count:
                wait = max(wait, recent[len(recent) - count] + seconds - now)
        return max(1, math.ceil(wait))


def rate_limited(status: int = 429, reset_s: int = 1, limit: int = 100) -> web.Response:
    """Feishu's documented frequency-limit answer (HTTP 429, or 400 from older APIs)."""
    return web.json_response(
        {"code": APP_RATE_LIMITED, "msg": "request trigger frequency limit"},
        status=status,
        headers={"x-ogw-ratelimit-limit": str(limit), "x-ogw-ratelimit-reset": str(reset_s)},
    )


def sign(timestamp: str, secret: str) -> str:
    key = (timestamp + "\n" + secret).encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


_CELL = re.compile(r"^([A-Z]+)(\d+)?$")


def col_number(letters: str) -> int:
    n = 0
    for ch in letters:
        n = n * 26 + (ord(ch) - 64)
    return n


def parse_range(text: str) -> tuple[str, int, int | None, int, int | None]:
    """`sheet!A1:C4` -> (sheet, first col, first row, last col, last row); rows may be None."""
    sheet, sep, cells = text.partition("!")
    if not sep or not sheet:
        raise ValueError(f"range {text!r} lacks a sheet")
    first, colon, last = cells.partition(":")
    m1, m2 = _CELL.match(first), _CELL.match(last if colon else first)
    if not m1 or not m2:
        raise ValueError(f"range {text!r} is not A1 notation")
    c1, c2 = col_number(m1.group(1)), col_number(m2.group(1))
    r1 = int(m1.group(2)) if m1.group(2) else None
    r2 = int(m2.group(2)) if m2.group(2) else None
    if c2 < c1 or (r1 is not None and r2 is not None and r2 < r1):
        raise ValueError(f"range {text!r} is reversed")
    return sheet, c1, r1, c2, r2


def col_letters(n: int) -> str:
    out = ""
    while n:
        n, rem = divmod(n - 1, 26)
        out = chr(65 + rem) + out
    return out


def card_problems(card: Any) -> list[str]:
    """What a card JSON 2.0 lacks that Feishu requires (empty list: acceptable)."""
    problems: list[str] = []
    if not isinstance(card, dict):
        return ["card is not an object"]
    if card.get("schema") != "2.0":
        problems.append("schema must be '2.0'")
    header = card.get("header")
    if header is not None:
        title = header.get("title") or {}
        if title.get("tag") not in ("plain_text", "lark_md") or not title.get("content"):
            problems.append("header.title needs tag plain_text and content")
        if header.get("template", "default") not in CARD_TEMPLATES:
            problems.append(f"header.template {header.get('template')!r} unknown")
    body = card.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("elements"), list):
        problems.append("body.elements must be a list")
        return problems
    problems.extend(_element_problems(body["elements"], "body.elements"))
    return problems


def _form_problems(form: dict[str, Any], at: str, root: bool) -> list[str]:
    """Feishu's form container (card JSON 2.0): only under the card's root, a `name`, no
    form inside; every interactive component in it named, names unique in the card; at
    least one button with `form_action_type: submit` (its press sends `form_value`)."""
    problems: list[str] = []
    if not root:
        problems.append(f"{at}: a form may only sit at the card's root")
    if not isinstance(form.get("name"), str) or not form["name"]:
        problems.append(f"{at}: form needs a name")
    named: list[dict[str, Any]] = []
    problems.extend(_element_problems(form.get("elements") or [], f"{at}.elements", named))
    names = [e.get("name") for e in named]
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
        problems.append(f"{at}: every input and button in a form needs a unique name")
    if not any(e.get("form_action_type") == "submit" for e in named if e.get("tag") == "button"):
        problems.append(f"{at}: a form needs a button with form_action_type submit")
    return problems


def _element_problems(
    elements: list[Any], where: str, form: list[dict[str, Any]] | None = None
) -> list[str]:
    """`form`: the interactive components met so far inside a form container."""
    problems: list[str] = []
    for i, element in enumerate(elements):
        at = f"{where}[{i}]"
        tag = element.get("tag") if isinstance(element, dict) else None
        if form is not None and tag in ("button", "input"):
            form.append(element)
        if tag == "markdown":
            if not isinstance(element.get("content"), str):
                problems.append(f"{at}: markdown needs string content")
        elif tag == "hr":
            pass
        elif tag == "button":
            text = element.get("text") or {}
            if text.get("tag") != "plain_text" or not text.get("content"):
                problems.append(f"{at}: button needs text plain_text")
            behaviors = element.get("behaviors")
            submits = element.get("form_action_type")
            if submits is not None and (form is None or submits not in ("submit", "reset")):
                problems.append(f"{at}: form_action_type {submits!r} outside a form or unknown")
            if submits is not None and behaviors is None:
                pass  # a form's submit or reset button needs no behaviors
            elif not isinstance(behaviors, list) or not behaviors:
                problems.append(f"{at}: button needs behaviors")
            else:
                for b in behaviors:
                    if b.get("type") == "open_url" and not b.get("default_url"):
                        problems.append(f"{at}: open_url needs default_url")
                    elif b.get("type") == "callback" and not isinstance(b.get("value"), dict):
                        problems.append(f"{at}: callback needs a value object")
                    elif b.get("type") not in ("open_url", "callback"):
                        problems.append(f"{at}: unknown behavior {b.get('type')!r}")
        elif tag == "column_set":
            for j, column in enumerate(element.get("columns") or []):
                if column.get("tag") != "column":
                    problems.append(f"{at}.columns[{j}]: tag must be column")
                problems.extend(
                    _element_problems(column.get("elements") or [], f"{at}.columns[{j}]", form)
                )
        elif tag == "form":
            problems.extend(_form_problems(element, at, root=where == "body.elements"))
        elif tag == "input":
            limit = element.get("max_length", 1000)
            if not isinstance(limit, int) or not 1 <= limit <= 1000:
                problems.append(f"{at}: input max_length must be 1..1000")
            placeholder = element.get("placeholder")
            if placeholder is not None and placeholder.get("tag") != "plain_text":
                problems.append(f"{at}: input placeholder needs tag plain_text")
        elif tag in ("action", "note", "div"):
            problems.append(f"{at}: {tag} is not supported in card JSON 2.0")
        else:
            problems.append(f"{at}: unknown tag {tag!r}")
    return problems


def _form_parts(elements: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The inputs and buttons among `elements`, columns and forms included."""
    inputs: list[dict[str, Any]] = []
    buttons: list[dict[str, Any]] = []
    for element in elements:
        tag = element.get("tag")
        if tag == "input":
            inputs.append(element)
        elif tag == "button":
            buttons.append(element)
        nested = list(element.get("elements") or [])
        for column in element.get("columns") or []:
            nested.extend(column.get("elements") or [])
        more_inputs, more_buttons = _form_parts(nested)
        inputs += more_inputs
        buttons += more_buttons
    return inputs, buttons


@dataclass
class Sheet:
    sheet_id: str
    title: str
    rows: list[list[Any]] = field(default_factory=list)


class FeishuContractServer:
    def __init__(
        self,
        *,
        hooks: dict[str, Hook] | None = None,
        apps: dict[str, str] | None = None,
        token_ttl_s: float = 7200.0,
        time_scale: float = 1.0,
        users: set[str] | None = None,
        spreadsheets: set[str] | None = None,
        chats: set[str] | None = None,
        emails: dict[str, str] | None = None,
    ) -> None:
        self.hooks = hooks or {}
        self.apps = apps or {}
        self.token_ttl_s = token_ttl_s
        self.time_scale = time_scale
        self.users = users
        self.chats = chats  # None: the app is in every chat
        self.emails = emails or {}  # address -> open_id, for the contact API
        self.contact_calls: list[list[str]] = []
        self.bot_windows: dict[str, Window] = {}
        self.app_window = Window([(100, 1.0 * time_scale)])
        self.api_windows: dict[tuple[str, str], Window] = {}  # (app, API) -> its window
        self.message_arrivals: list[tuple[float, str, str]] = []  # (monotonic, app, API)
        self.accepted: dict[str, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
        self.rejections: list[tuple[str, int]] = []  # (what, code)
        self.limit_resets: list[int] = []  # the x-ogw-ratelimit-reset of each app API limit
        self.tokens: dict[str, float] = {}  # token -> expires at (monotonic)
        self.token_apps: dict[str, str] = {}  # token -> the app_id it was issued to
        self.tokens_issued = 0
        self.token_requests = 0
        # answers the token endpoint gives before its real logic, first one first
        self.token_answers: list[web.Response] = []
        # message_id -> the body sent, `receive_id_type`, `app_id` (the sender), `sent_at`
        # (wall clock; a test ages a message by lowering it), `recalled`, `updates` (the
        # cards it was updated to, in order)
        self.messages: dict[str, dict[str, Any]] = {}
        self.update_windows: dict[str, Window] = {}  # message_id -> its updates' window
        self.uuids: dict[str, str] = {}
        self.urgent_calls: list[tuple[str, list[str]]] = []
        # A test holds the answers of sends (the message is stored) or updates (not yet
        # applied) until it sets the event, e.g. to kill the gateway meanwhile; `arrived`
        # counts the requests that came to each ("send", "update").
        self.hold: dict[str, asyncio.Event] = {}
        self.arrived: Counter[str] = Counter()
        self.sheets: dict[str, dict[str, Sheet]] = {t: {} for t in (spreadsheets or set())}
        self.sheet_calls: list[str] = []
        self.lose_append_answers = 0  # apply the next N appends, then answer 500 (lost reply)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # ----------------------------------------------------------------- lifecycle
    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/open-apis/bot/v2/hook/{token}", self.bot_hook)
        app.router.add_post("/open-apis/auth/v3/tenant_access_token/internal", self.token)
        app.router.add_post("/open-apis/im/v1/messages", self.send_message)
        app.router.add_patch("/open-apis/im/v1/messages/{id}", self.update_message)
        app.router.add_patch("/open-apis/im/v1/messages/{id}/urgent_phone", self.urgent_phone)
        app.router.add_post("/open-apis/contact/v3/users/batch_get_id", self.batch_get_id)
        base = "/open-apis/sheets"
        app.router.add_get(base + "/v3/spreadsheets/{st}/sheets/query", self.sheets_query)
        app.router.add_post(base + "/v2/spreadsheets/{st}/sheets_batch_update", self.add_sheets)
        app.router.add_post(base + "/v2/spreadsheets/{st}/values_append", self.values_append)
        app.router.add_post(
            base + "/v2/spreadsheets/{st}/values_batch_update", self.values_batch_update
        )
        app.router.add_get(base + "/v2/spreadsheets/{st}/values/{range}", self.values_get)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FeishuContractServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def revoke_tokens(self) -> None:
        """Invalidates every issued token early (Feishu may do so, e.g. on secret reset)."""
        for tok in self.tokens:
            self.tokens[tok] = 0.0

    def hook_url(self, token: str) -> str:
        return f"{self.base_url}/open-apis/bot/v2/hook/{token}"

    # ----------------------------------------------------------------- bot
    async def bot_hook(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        hook = self.hooks.get(token)
        if hook is None:
            return web.json_response(
                {
                    "code": 19001,
                    "msg": "param invalid: incoming webhook access token invalid",
                    "data": {},
                },
                status=404,
            )
        raw = await request.read()
        if len(raw) > MAX_BOT_BODY:
            return self._reject("bot", BAD_PARAMS, f"request body {len(raw)} exceeds 20 KB", 400)
        try:
            body = json.loads(raw)
        except ValueError:
            return self._reject("bot", BAD_PARAMS, "body is not JSON", 400)
        if hook.allowed_ips is not None and request.remote not in hook.allowed_ips:
            return self._reject("bot", 19022, "Ip Not Allowed")
        if hook.secret is not None:
            ts, signature = str(body.get("timestamp", "")), str(body.get("sign", ""))
            if (
                not ts.isdigit()
                or abs(time.time() - int(ts)) > 3600
                or not hmac.compare_digest(sign(ts, hook.secret), signature)
            ):
                return self._reject(
                    "bot", 19021, "sign match fail or timestamp is not within one hour"
                )
        if hook.keyword is not None and hook.keyword not in raw.decode():
            return self._reject("bot", 19024, "Key Words Not Found")
        if body.get("msg_type") == "interactive":
            problems = card_problems(body.get("card"))
            if problems:
                return self._reject("bot", BAD_PARAMS, "card invalid: " + "; ".join(problems), 400)
        elif body.get("msg_type") not in ("text", "post"):
            return self._reject("bot", BAD_PARAMS, "msg_type invalid", 400)
        window = self.bot_windows.setdefault(
            token, Window([(5, 1.0 * self.time_scale), (100, 60.0 * self.time_scale)])
        )
        now = time.monotonic()
        if not window.admit(now):
            return self._reject(
                "bot", 11232, "frequency limited psm[lark.oapi.app_platform_runtime]"
            )
        self.accepted[token].append((now, body))
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    def _reject(self, what: str, code: int, msg: str, status: int = 200) -> web.Response:
        self.rejections.append((what, code))
        return web.json_response({"code": code, "msg": msg, "data": {}}, status=status)

    # ----------------------------------------------------------------- app auth
    async def token(self, request: web.Request) -> web.Response:
        self.token_requests += 1
        if self.token_answers:
            return self.token_answers.pop(0)
        body = await request.json()
        app_id, secret = body.get("app_id"), body.get("app_secret")
        if app_id not in self.apps:
            self.rejections.append(("token", INVALID_PARAM))
            return web.json_response({"code": INVALID_PARAM, "msg": "invalid param"}, status=400)
        if not hmac.compare_digest(self.apps[app_id], str(secret)):
            self.rejections.append(("token", APP_SECRET_INVALID))
            return web.json_response(
                {"code": APP_SECRET_INVALID, "msg": "app secret invalid"}, status=400
            )
        now = time.monotonic()
        # Feishu hands back the current token while it has plenty of life left.
        for tok, expires in self.tokens.items():
            if self.token_apps.get(tok) == app_id and expires - now > self.token_ttl_s / 4:
                return web.json_response(
                    {
                        "code": 0,
                        "msg": "ok",
                        "tenant_access_token": tok,
                        "expire": int(expires - now),
                    }
                )
        self.tokens_issued += 1
        tok = f"t-{self.tokens_issued:04d}-{next(self._ids)}"
        self.tokens[tok] = now + self.token_ttl_s
        self.token_apps[tok] = str(app_id)
        return web.json_response(
            {"code": 0, "msg": "ok", "tenant_access_token": tok, "expire": self.token_ttl_s}
        )

    def _auth(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        tok = header.removeprefix("Bearer ").strip()
        expires = self.tokens.get(tok)
        if not header.startswith("Bearer ") or expires is None or expires <= time.monotonic():
            return self._reject(
                "auth", INVALID_TOKEN, "Invalid access token for authorization", 400
            )
        now = time.monotonic()
        if not self.app_window.admit(now):
            return self._limited(self.app_window, now, 100)
        return None

    def _limited(self, window: Window, now: float, limit: int) -> web.Response:
        """The frequency-limit answer of an app API, its reset the window's own."""
        reset = window.reset_s(now)
        self.rejections.append(("app", APP_RATE_LIMITED))
        self.limit_resets.append(reset)
        return rate_limited(reset_s=reset, limit=limit)

    # ----------------------------------------------------------------- messages
    def _api_limited(self, request: web.Request, api: str) -> web.Response | None:
        """The per-app limit of a message API (50/s, 1000/min); None when within it."""
        app = self._app_of(request)
        window = self.api_windows.setdefault(
            (app, api), Window([(50, 1.0 * self.time_scale), (1000, 60.0 * self.time_scale)])
        )
        now = time.monotonic()
        if not window.admit(now):
            return self._limited(window, now, 50)
        self.message_arrivals.append((now, app, api))
        return None

    async def send_message(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if (limited := self._api_limited(request, "send")) is not None:
            return limited
        id_type = request.query.get("receive_id_type")
        if id_type not in ("open_id", "user_id", "union_id", "email", "chat_id"):
            return self._reject("im", BAD_PARAMS, "receive_id_type invalid", 400)
        body = await request.json()
        if not body.get("receive_id") or body.get("msg_type") not in (
            "text",
            "interactive",
            "post",
        ):
            return self._reject("im", BAD_PARAMS, "receive_id / msg_type invalid", 400)
        content = body.get("content")
        if not isinstance(content, str):
            return self._reject("im", BAD_PARAMS, "content must be a JSON string", 400)
        if id_type == "chat_id" and self.chats is not None and body["receive_id"] not in self.chats:
            return self._reject("im", 230002, "Bot/User can NOT be out of the chat.", 400)
        if body["msg_type"] == "interactive":
            problems = card_problems(json.loads(content))
            if problems:
                return self._reject("im", 230099, "card invalid: " + "; ".join(problems), 400)
        uuid = body.get("uuid")
        if uuid and uuid in self.uuids:
            mid = self.uuids[uuid]
        else:
            mid = f"om_{next(self._ids):06d}"
            self.messages[mid] = {
                **body,
                "receive_id_type": id_type,
                "app_id": self._app_of(request),
                "sent_at": time.time(),
                "recalled": False,
                "updates": [],
            }
            if uuid:
                self.uuids[uuid] = mid
        self.arrived["send"] += 1
        if (held := self.hold.get("send")) is not None:
            await held.wait()  # stored: a lost answer once the sender is gone
        return web.json_response(
            {"code": 0, "msg": "success", "data": {"message_id": mid, "msg_type": body["msg_type"]}}
        )

    def _app_of(self, request: web.Request) -> str:
        """The app whose tenant_access_token authorised `request` (already checked)."""
        tok = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return self.token_apps.get(tok, "")

    def recall(self, message_id: str) -> None:
        """Someone recalled the message in the chat."""
        self.messages[message_id]["recalled"] = True

    async def update_message(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if (limited := self._api_limited(request, "update")) is not None:
            return limited
        mid = request.match_info["id"]
        message = self.messages.get(mid)
        if message is None:
            return self._reject(
                "update", INVALID_REQUEST,
                "Your request contains an invalid request parameter, ext=invalid message_id.", 400,
            )  # fmt: skip
        body = await request.json()
        if not isinstance(body.get("content"), str):
            return self._reject("update", BAD_PARAMS, "content must be a JSON string", 400)
        try:
            card = json.loads(body["content"])
        except ValueError:
            return self._reject("update", BAD_PARAMS, "content is not JSON", 400)
        if message["recalled"]:
            return self._reject("update", MESSAGE_RECALLED, "The message is recalled.", 400)
        refused = self._update_refused(request, message, card)
        if refused is not None:
            return self._reject(
                "update", UPDATE_REFUSED,
                f"Your request contains an invalid request parameter, ext={refused}.", 400,
            )  # fmt: skip
        self.arrived["update"] += 1
        if (held := self.hold.get("update")) is not None:
            await held.wait()  # not applied before the test lets it
        window = self.update_windows.setdefault(mid, Window([(5, 1.0 * self.time_scale)]))
        if not window.admit(time.monotonic()):
            return self._reject(
                "update", MESSAGE_RATE_LIMITED, "This operation triggers the frequency limit.", 400
            )
        message["updates"].append(card)
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    def _update_refused(
        self, request: web.Request, message: dict[str, Any], card: Any
    ) -> str | None:
        """Why Feishu's documented limits refuse this update (None: they allow it)."""
        if message.get("msg_type") != "interactive":
            return "only an interactive message (a card) can be updated"
        if message.get("app_id") != self._app_of(request):
            return "the message was sent by another identity"
        if time.time() - float(message["sent_at"]) > CARD_UPDATE_DAYS * 86400:
            return f"the message was sent more than {CARD_UPDATE_DAYS} days ago"
        sent = json.loads(message["content"])
        for what, which in (("as sent", sent), ("new", card)):
            config = which.get("config") if isinstance(which, dict) else None
            if not isinstance(config, dict) or config.get("update_multi") is not True:
                return f"the {what} card is not a shared card (config.update_multi)"
        problems = card_problems(card)
        if problems:
            return "card invalid: " + "; ".join(problems)
        return None

    def press(
        self,
        message_id: str,
        button: str,
        *,
        verification_token: str,
        typed: dict[str, str] | None = None,
        open_id: str = "ou_presser",
        event_id: str = "ev-press-1",
    ) -> dict[str, Any]:
        """The `card.action.trigger` callback (schema 2.0) Feishu posts when the button with
        text `button` is pressed on the message's card as it was sent: `action.value` is the
        button's callback value; for a button in a form container, `action.name` is its name
        and `action.form_value` holds each input of the form by name, with what was `typed`
        into it ("" for nothing)."""
        card = json.loads(self.messages[message_id]["content"])
        for element in card["body"]["elements"]:
            inputs, buttons = _form_parts([element])
            found = [b for b in buttons if (b.get("text") or {}).get("content") == button]
            if found:
                break
        else:
            raise LookupError(f"no button {button!r} on {message_id}")
        pressed = found[0]
        value = next(
            (b.get("value") for b in pressed.get("behaviors") or [] if b["type"] == "callback"),
            None,
        )
        action: dict[str, Any] = {"value": value, "tag": "button"}
        if element.get("tag") == "form":
            action["name"] = pressed.get("name")
            action["form_value"] = {i["name"]: (typed or {}).get(i["name"], "") for i in inputs}
        return {
            "schema": "2.0",
            "header": {
                "event_id": event_id, "token": verification_token,
                "create_time": str(int(time.time() * 1000)),
                "event_type": "card.action.trigger", "tenant_key": "tk", "app_id": "cli_app",
            },
            "event": {
                "operator": {"tenant_key": "tk", "open_id": open_id},
                "token": "c-update-token", "action": action, "host": "im_message",
                "context": {"open_message_id": message_id, "open_chat_id": "oc_1"},
            },
        }  # fmt: skip

    @staticmethod
    def callback_request(
        body: dict[str, Any], *, encrypt_key: str | None = None, at: int | None = None
    ) -> tuple[dict[str, str], bytes]:
        """(headers, raw body) of the callback request Feishu posts for `body` (e.g. from
        `press`): encrypted and signed when the app has an encrypt key, else plain and
        unsigned (module docstring). `at`: the request's Unix time (default now)."""
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if encrypt_key is None:
            return headers, json.dumps(body).encode()
        from cryptography.hazmat.primitives import padding
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        key = hashlib.sha256(encrypt_key.encode()).digest()
        iv = os.urandom(16)
        padder = padding.PKCS7(128).padder()
        plain = padder.update(json.dumps(body).encode()) + padder.finalize()
        encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
        sealed = iv + encryptor.update(plain) + encryptor.finalize()
        raw = json.dumps({"encrypt": base64.b64encode(sealed).decode()}).encode()
        timestamp = str(int(time.time()) if at is None else at)
        nonce = os.urandom(8).hex()
        signature = hashlib.sha256((timestamp + nonce + encrypt_key).encode() + raw).hexdigest()
        headers.update(
            {
                "X-Lark-Request-Timestamp": timestamp,
                "X-Lark-Request-Nonce": nonce,
                "X-Lark-Signature": signature,
            }
        )
        return headers, raw

    async def urgent_phone(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        mid = request.match_info["id"]
        if request.query.get("user_id_type") not in ("open_id", "user_id", "union_id"):
            return self._reject("urgent", BAD_PARAMS, "user_id_type required", 400)
        if mid not in self.messages:
            return self._reject("urgent", 230011, "message not found", 400)
        body = await request.json()
        users = body.get("user_id_list")
        if not isinstance(users, list) or not users:
            return self._reject("urgent", BAD_PARAMS, "user_id_list required", 400)
        invalid = [u for u in users if self.users is not None and u not in self.users]
        self.urgent_calls.append((mid, [u for u in users if u not in invalid]))
        return web.json_response(
            {"code": 0, "msg": "success", "data": {"invalid_user_id_list": invalid}}
        )

    # ----------------------------------------------------------------- contact
    async def batch_get_id(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if request.query.get("user_id_type", "open_id") != "open_id":
            return self._reject("contact", BAD_PARAMS, "only open_id is emulated", 400)
        body = await request.json()
        emails = body.get("emails") or []
        if not isinstance(emails, list) or len(emails) > 50:
            return self._reject("contact", BAD_PARAMS, "emails: at most 50", 400)
        self.contact_calls.append([str(e) for e in emails])
        users = []
        for email in emails:
            user: dict[str, Any] = {"email": email}
            if email in self.emails:
                user["user_id"] = self.emails[email]
                user["status"] = {"is_frozen": False, "is_resigned": False, "is_activated": True}
            users.append(user)
        return web.json_response({"code": 0, "msg": "success", "data": {"user_list": users}})

    # ----------------------------------------------------------------- sheets
    def _spreadsheet(self, request: web.Request) -> dict[str, Sheet] | None:
        return self.sheets.get(request.match_info["st"])

    async def sheets_query(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        book = self._spreadsheet(request)
        if book is None:
            return self._reject("sheets", 1310214, "spreadsheet not found", 400)
        self.sheet_calls.append("query")
        sheets = [
            {"sheet_id": s.sheet_id, "title": s.title, "index": i}
            for i, s in enumerate(book.values())
        ]
        return web.json_response({"code": 0, "msg": "success", "data": {"sheets": sheets}})

    async def add_sheets(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        book = self._spreadsheet(request)
        if book is None:
            return self._reject("sheets", 1310214, "spreadsheet not found", 400)
        self.sheet_calls.append("add_sheet")
        replies = []
        for req in (await request.json()).get("requests", []):
            props = (req.get("addSheet") or {}).get("properties") or {}
            title = props.get("title")
            if not title or any(s.title == title for s in book.values()):
                return self._reject("sheets", 90210, "sheet title empty or taken", 400)
            sid = f"s{next(self._ids):05d}"
            book[sid] = Sheet(sid, title)
            replies.append(
                {
                    "addSheet": {
                        "properties": {"sheetId": sid, "title": title, "index": len(book) - 1}
                    }
                }
            )
        return web.json_response({"code": 0, "msg": "success", "data": {"replies": replies}})

    def _check_range(
        self, book: dict[str, Sheet], text: str, values: Any
    ) -> tuple[Sheet, int, int | None] | str:
        try:
            sid, c1, r1, c2, r2 = parse_range(text)
        except ValueError as exc:
            return str(exc)
        if sid not in book:
            return f"sheet {sid} not found"
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(r, list) for r in values)
        ):
            return "values must be a non-empty list of rows"
        if len(values) > 5000 or c2 - c1 + 1 > 100:
            return "over 5000 rows or 100 columns"
        width = c2 - c1 + 1
        if any(len(row) > width for row in values):
            return f"a row has more cells than the range's {width} columns"
        if r1 is not None and r2 is not None and len(values) > r2 - r1 + 1:
            return "more rows than the range holds"
        return book[sid], c1, r1

    async def values_append(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        book = self._spreadsheet(request)
        if book is None:
            return self._reject("sheets", 1310214, "spreadsheet not found", 400)
        if request.query.get("insertDataOption", "OVERWRITE") not in ("OVERWRITE", "INSERT_ROWS"):
            return self._reject("sheets", RANGE_ERROR, "insertDataOption invalid", 400)
        vr = (await request.json()).get("valueRange") or {}
        checked = self._check_range(book, str(vr.get("range", "")), vr.get("values"))
        if isinstance(checked, str):
            return self._reject("sheets", RANGE_ERROR, checked, 400)
        sheet, c1, _ = checked
        if c1 != 1:
            return self._reject("sheets", RANGE_ERROR, "archive appends start at column A", 400)
        self.sheet_calls.append("append")
        first = len(sheet.rows) + 1
        for row in vr["values"]:
            sheet.rows.append(list(row))
        width = max(len(r) for r in vr["values"])
        last = len(sheet.rows)
        if self.lose_append_answers > 0:
            self.lose_append_answers -= 1
            return web.json_response({"code": 500, "msg": "reply lost"}, status=500)
        updated = f"{sheet.sheet_id}!A{first}:{col_letters(width)}{last}"
        return web.json_response({"code": 0, "msg": "success", "data": {
            "spreadsheetToken": request.match_info["st"],
            "tableRange": updated,
            "revision": len(self.sheet_calls),
            "updates": {"updatedRange": updated, "updatedRows": last - first + 1,
                        "updatedColumns": width, "updatedCells": (last - first + 1) * width},
        }})  # fmt: skip

    async def values_batch_update(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        book = self._spreadsheet(request)
        if book is None:
            return self._reject("sheets", 1310214, "spreadsheet not found", 400)
        ranges = (await request.json()).get("valueRanges") or []
        checked_all = []
        for vr in ranges:
            checked = self._check_range(book, str(vr.get("range", "")), vr.get("values"))
            if isinstance(checked, str):
                return self._reject("sheets", RANGE_ERROR, checked, 400)
            sheet, c1, r1 = checked
            if r1 is None or r1 > len(sheet.rows):
                return self._reject("sheets", RANGE_ERROR, f"row {r1} does not exist yet", 400)
            checked_all.append((sheet, c1, r1, vr["values"]))
        self.sheet_calls.append("batch_update")
        for sheet, c1, r1, values in checked_all:
            for i, row in enumerate(values):
                target = sheet.rows[r1 - 1 + i]
                for j, cell in enumerate(row):
                    while len(target) < c1 + j:
                        target.append(None)
                    target[c1 - 1 + j] = cell
        responses = [{"updatedRange": vr["range"]} for vr in ranges]
        return web.json_response({"code": 0, "msg": "success", "data": {"responses": responses}})

    async def values_get(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        book = self._spreadsheet(request)
        if book is None:
            return self._reject("sheets", 1310214, "spreadsheet not found", 400)
        text = request.match_info["range"]
        try:
            sid, c1, r1, c2, r2 = parse_range(text)
        except ValueError as exc:
            return self._reject("sheets", RANGE_ERROR, str(exc), 400)
        if sid not in book:
            return self._reject("sheets", RANGE_ERROR, f"sheet {sid} not found", 400)
        rows = book[sid].rows[(r1 or 1) - 1 : r2]
        values = [[(row + [None] * c2)[c] for c in range(c1 - 1, c2)] for row in rows]
        return web.json_response(
            {"code": 0, "msg": "success", "data": {"valueRange": {"range": text, "values": values}}}
        )
