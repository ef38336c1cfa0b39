"""Phone calls through Twilio's Calls API (`POST /2010-04-01/Accounts/{sid}/Calls.json`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from xml.sax.saxutils import escape

import httpx

from trainsentry.config.channels import TwilioSettings
from trainsentry.notifiers.base import PermanentError, RateLimitedError, RetryableError
from trainsentry.notifiers.phone.base import CallReceipt, PhoneCall
from trainsentry.notifiers.settings import read_secret

log = logging.getLogger(__name__)


def twiml(text: str, language: str = "en-US", repeat: int = 2) -> str:
    """TwiML that reads `text` aloud `repeat` times."""
    say = f'<Say language="{escape(language)}">{escape(text)}</Say>'
    return f"<Response>{say * repeat}</Response>"


class TwilioProvider:
    name = "twilio"

    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        from_number: str,
        *,
        base_url: str = "https://api.twilio.com",
        language: str = "en-US",
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self.account_sid = account_sid
        self._auth = (account_sid, auth_token)
        self.from_number = from_number
        self.base_url = base_url.rstrip("/")
        self.language = language
        self._client = client or httpx.AsyncClient(timeout=timeout_s)

    @classmethod
    def from_settings(
        cls, settings: TwilioSettings, env: Mapping[str, str] | None = None
    ) -> TwilioProvider:
        return cls(
            settings.account_sid,
            read_secret(settings.auth_token_env, env),
            settings.from_number,
            base_url=settings.base_url,
            language=settings.voice_language,
        )

    def __repr__(self) -> str:
        return f"TwilioProvider(account_sid={self.account_sid!r})"

    async def call(self, call: PhoneCall) -> CallReceipt:
        if not call.person.phone:
            raise PermanentError(f"{call.person.name} has no phone number")
        url = f"{self.base_url}/2010-04-01/Accounts/{self.account_sid}/Calls.json"
        form = {
            "To": call.person.phone,
            "From": self.from_number,
            "Twiml": twiml(call.text, self.language),
        }
        try:
            response = await self._client.post(url, data=form, auth=self._auth)
        except httpx.HTTPError as exc:
            raise RetryableError(f"Twilio: {type(exc).__name__}") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        status = response.status_code
        if status == 429:
            retry = response.headers.get("Retry-After")
            raise RateLimitedError(
                "Twilio rate limited", code=answer.get("code", 429),
                retry_after=float(retry) if retry and retry.isdigit() else None,
            )  # fmt: skip
        if status >= 500:
            raise RetryableError(f"Twilio HTTP {status}", code=status)
        if status >= 400:
            log.error(
                "event=twilio_call_refused http=%s code=%s message=%r",
                status, answer.get("code"), answer.get("message"),
            )  # fmt: skip
            raise PermanentError(f"Twilio refused the call: {answer.get('message')}", code=status)
        sid = answer.get("sid")
        return CallReceipt(self.name, str(sid) if sid else None, {"status": answer.get("status")})

    async def aclose(self) -> None:
        await self._client.aclose()
