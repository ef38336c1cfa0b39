"""Phone calls through any HTTP voice gateway (Aliyun/Tencent style), from a body template.

The body template is Jinja2 in a sandbox that must render JSON; values go in through the
`tojson` filter so a name or message cannot break out of its string, e.g.
`{"CalledNumber": {{ phone|tojson }}, "TtsParam": {{ {"text": text}|tojson|tojson }}}`.
Variables: phone, name, text, alert_id, idempotency_key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx
from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from trainsentry.alerts import Person
from trainsentry.config.channels import WebhookPhoneSettings
from trainsentry.notifiers.base import PermanentError, RateLimitedError, RetryableError
from trainsentry.notifiers.phone.base import CallReceipt, PhoneCall
from trainsentry.notifiers.settings import read_secret

log = logging.getLogger(__name__)
_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


def render_body(template: str, call: PhoneCall) -> dict[str, Any]:
    """The JSON body for `call` (pure); raises PermanentError if the template is broken."""
    try:
        text = _ENV.from_string(template).render(
            phone=call.person.phone,
            name=call.person.name,
            text=call.text,
            alert_id=call.alert_id,
            idempotency_key=call.idempotency_key,
        )
        body = json.loads(text)
    except (TemplateError, ValueError) as exc:
        raise PermanentError(f"phone webhook body template: {exc}") from exc
    if not isinstance(body, dict):
        raise PermanentError("phone webhook body template must render a JSON object")
    return body


def _dig(value: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


class WebhookPhoneProvider:
    name = "webhook"

    def __init__(
        self,
        url: str,
        body_template: str,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        success_field: str | None = None,
        success_value: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self._url = url
        self.body_template = body_template
        self.method = method
        self._headers = dict(headers or {})
        self.success_field = success_field
        self.success_value = success_value
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        # Fail at start-up, not at 3 a.m., if the template is broken.
        render_body(body_template, PhoneCall(Person("probe", "+10000000000"), "probe", 0, "probe"))

    @classmethod
    def from_settings(
        cls, settings: WebhookPhoneSettings, env: Mapping[str, str] | None = None
    ) -> WebhookPhoneProvider:
        headers = dict(settings.headers)
        for header, env_name in settings.header_secrets_env.items():
            headers[header] = read_secret(env_name, env)
        return cls(
            read_secret(settings.url_env, env),
            settings.body_template,
            method=settings.method,
            headers=headers,
            success_field=settings.success_field,
            success_value=settings.success_value,
        )

    def __repr__(self) -> str:
        return f"WebhookPhoneProvider(method={self.method!r})"

    async def call(self, call: PhoneCall) -> CallReceipt:
        if not call.person.phone:
            raise PermanentError(f"{call.person.name} has no phone number")
        body = render_body(self.body_template, call)
        headers = {"Idempotency-Key": call.idempotency_key, **self._headers}
        try:
            response = await self._client.request(
                self.method, self._url, json=body, headers=headers
            )
        except httpx.HTTPError as exc:
            raise RetryableError(f"phone webhook: {type(exc).__name__}") from exc
        status = response.status_code
        if status == 429:
            raise RateLimitedError("phone webhook rate limited", code=429)
        if status >= 500:
            raise RetryableError(f"phone webhook HTTP {status}", code=status)
        if status >= 400:
            log.error("event=phone_webhook_refused http=%s", status)
            raise PermanentError(f"phone webhook refused the call (HTTP {status})", code=status)
        try:
            answer: Any = response.json()
        except ValueError:
            answer = None
        if self.success_field is not None:
            got = _dig(answer, self.success_field)
            if str(got) != str(self.success_value):
                log.error("event=phone_webhook_failed field=%s got=%r", self.success_field, got)
                raise PermanentError(f"phone webhook answered {self.success_field}={got!r}")
        call_id = _dig(answer, "RequestId") or _dig(answer, "request_id") or _dig(answer, "id")
        return CallReceipt(self.name, str(call_id) if call_id else None, {"http": status})

    async def aclose(self) -> None:
        await self._client.aclose()
