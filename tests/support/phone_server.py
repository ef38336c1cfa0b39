"""Local stand-ins for Twilio's Calls API and an HTTP voice gateway, checking request shapes."""

from __future__ import annotations

import base64
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree

from aiohttp import web

E164 = re.compile(r"^\+[1-9]\d{6,14}$")


@dataclass
class PhoneContractServer:
    account_sid: str = "AC" + "0" * 32
    auth_token: str = "twilio-token"
    from_number: str = "+15550001111"
    gateway_token: str = "gw-token"
    fail_next: list[int] = field(default_factory=list)  # HTTP statuses to answer first
    twilio_calls: list[dict[str, str]] = field(default_factory=list)
    gateway_calls: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    refused: list[tuple[str, int, str]] = field(default_factory=list)
    base_url: str = ""
    _runner: web.AppRunner | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{sid}/Calls.json", self.twilio)
        app.router.add_post("/voice/call", self.gateway)
        return app

    async def __aenter__(self) -> PhoneContractServer:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _refuse(self, what: str, status: int, message: str, code: int = 0) -> web.Response:
        self.refused.append((what, status, message))
        return web.json_response(
            {"code": code, "message": message, "status": status}, status=status
        )

    async def twilio(self, request: web.Request) -> web.Response:
        if self.fail_next:
            return self._refuse("twilio", self.fail_next.pop(0), "injected failure")
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return self._refuse("twilio", 401, "Authenticate", 20003)
        if request.match_info["sid"] != self.account_sid:
            return self._refuse("twilio", 404, "account not found", 20404)
        if request.content_type != "application/x-www-form-urlencoded":
            return self._refuse("twilio", 400, "form body expected", 21000)
        form = {k: str(v) for k, v in (await request.post()).items()}
        if not E164.match(form.get("To", "")):
            return self._refuse("twilio", 400, "Invalid 'To' Phone Number", 21211)
        if form.get("From") != self.from_number:
            return self._refuse("twilio", 400, "Invalid 'From' Phone Number", 21212)
        if "Twiml" not in form and "Url" not in form:
            return self._refuse("twilio", 400, "Twiml or Url required", 21205)
        if "Twiml" in form:
            try:
                root = ElementTree.fromstring(form["Twiml"])
            except ElementTree.ParseError:
                return self._refuse("twilio", 400, "Twiml not valid XML", 12100)
            if root.tag != "Response" or root.find("Say") is None:
                return self._refuse("twilio", 400, "Twiml must say something", 12100)
        self.twilio_calls.append(form)
        sid = f"CA{next(self._ids):032d}"
        return web.json_response(
            {"sid": sid, "status": "queued", "to": form["To"], "from": form["From"]}, status=201
        )

    async def gateway(self, request: web.Request) -> web.Response:
        if self.fail_next:
            return self._refuse("gateway", self.fail_next.pop(0), "injected failure")
        if request.headers.get("X-Api-Key") != self.gateway_token:
            return self._refuse("gateway", 403, "bad api key")
        if not request.headers.get("Idempotency-Key"):
            return self._refuse("gateway", 400, "Idempotency-Key required")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self._refuse("gateway", 400, "not JSON")
        if not E164.match(str(body.get("CalledNumber", ""))) or not body.get("TtsParam"):
            return self._refuse("gateway", 400, "CalledNumber / TtsParam missing")
        json.loads(body["TtsParam"])  # must itself be a JSON string
        self.gateway_calls.append((dict(request.headers), body))
        return web.json_response({"Code": "OK", "RequestId": f"req-{next(self._ids)}"})
