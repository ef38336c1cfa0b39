"""Email over SMTP (STARTTLS, implicit TLS or plain; optional AUTH): a channel and a sender.

`send_email` is what the weekly report uses; `EmailNotifier` is the `email` channel for
alerts (P0/P1 by default). smtplib is blocking, so every SMTP session runs in a worker
thread (`asyncio.to_thread`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import smtplib
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Literal

from jinja2 import Environment

from trainsentry.alerts import Priority
from trainsentry.config.channels import EmailSettings
from trainsentry.notifiers.base import (
    OutboundNotification,
    PermanentError,
    Receipt,
    RetryableError,
)
from trainsentry.notifiers.payload_contract import (
    NotificationPayload,
    PayloadError,
    alertname,
    annotation,
    gpu_of,
    job_of,
    node_of,
    parse_payload,
    rank_of,
)
from trainsentry.notifiers.ratelimit import RateLimit
from trainsentry.notifiers.settings import read_secret

log = logging.getLogger(__name__)

CHANNEL = "email"
RATE_LIMITS: tuple[RateLimit, ...] = (RateLimit(10, 1.0),)
Security = Literal["starttls", "tls", "none"]


@dataclass(frozen=True, slots=True)
class SmtpConfig:
    host: str
    port: int
    sender: str
    security: Security = "starttls"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_settings(
        cls, settings: EmailSettings, env: Mapping[str, str] | None = None
    ) -> SmtpConfig:
        password = read_secret(settings.password_env, env) if settings.password_env else None
        return cls(
            host=settings.host,
            port=settings.port,
            sender=settings.sender,
            security=settings.security,
            username=settings.username,
            password=password,
            timeout_s=settings.timeout_s,
        )


@dataclass(frozen=True, slots=True)
class Attachment:
    filename: str
    data: bytes
    mime_type: str = "application/octet-stream"


def build_message(
    sender: str,
    recipients: Sequence[str],
    subject: str,
    text: str,
    html: str | None = None,
    attachments: Sequence[Attachment] = (),
) -> EmailMessage:
    """A MIME message: text, optional HTML alternative, optional attachments (pure)."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = ", ".join(recipients)
    message["Subject"] = subject
    message["Date"] = formatdate(localtime=False)
    message["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or None)
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
    for item in attachments:
        maintype, _, subtype = item.mime_type.partition("/")
        message.add_attachment(
            item.data, maintype=maintype, subtype=subtype or "octet-stream", filename=item.filename
        )
    return message


def _cut(smtp: smtplib.SMTP) -> None:
    """Ends a session at its deadline: a shut-down socket wakes the blocked read at once."""
    sock = smtp.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _send_blocking(config: SmtpConfig, message: EmailMessage, recipients: Sequence[str]) -> None:
    """One SMTP session, `timeout_s` in all (not only per read: a server that trickles its
    answers never outlasts it), so the worker thread ends when the outbox stops waiting."""
    context = config.ssl_context or ssl.create_default_context()
    smtp: smtplib.SMTP
    if config.security == "tls":
        smtp = smtplib.SMTP_SSL(timeout=config.timeout_s, context=context)
    else:
        smtp = smtplib.SMTP(timeout=config.timeout_s)
    watchdog = threading.Timer(config.timeout_s, _cut, args=(smtp,))
    watchdog.daemon = True
    watchdog.start()
    try:
        _session(smtp, config, context, message, recipients)
    finally:
        watchdog.cancel()


def _session(
    smtp: smtplib.SMTP,
    config: SmtpConfig,
    context: ssl.SSLContext,
    message: EmailMessage,
    recipients: Sequence[str],
) -> None:
    # Made without a host (so the watchdog exists before the greeting is read), the session
    # names the server for STARTTLS's certificate check as the constructor would have.
    smtp._host = config.host  # type: ignore[attr-defined]
    smtp.connect(config.host, config.port)
    with smtp:
        smtp.ehlo()
        if config.security == "starttls":
            smtp.starttls(context=context)
            smtp.ehlo()
        if config.username:
            smtp.login(config.username, config.password or "")
        smtp.send_message(message, from_addr=config.sender, to_addrs=list(recipients))


async def send_email(
    config: SmtpConfig, message: EmailMessage, recipients: Sequence[str] | None = None
) -> str:
    """Sends `message` (to `recipients`, default its To); returns its Message-ID.

    Raises PermanentError for refusals retrying cannot fix (auth, rejected recipients, 5xx)
    and RetryableError for the rest (connection trouble, 4xx).
    """
    to = list(recipients) if recipients is not None else [
        a.strip() for a in str(message["To"]).split(",") if a.strip()
    ]  # fmt: skip
    if not to:
        raise PermanentError("email without recipients")
    try:
        await asyncio.to_thread(_send_blocking, config, message, to)
    except smtplib.SMTPAuthenticationError as exc:
        log.error("event=smtp_auth_failed host=%s user=%s", config.host, config.username)
        raise PermanentError(f"SMTP authentication failed ({exc.smtp_code})") from exc
    except smtplib.SMTPRecipientsRefused as exc:
        raise PermanentError(f"SMTP refused every recipient: {sorted(exc.recipients)}") from exc
    except smtplib.SMTPNotSupportedError as exc:
        raise PermanentError(f"SMTP server lacks a needed extension: {exc}") from exc
    except smtplib.SMTPResponseException as exc:
        if 400 <= exc.smtp_code < 500:
            raise RetryableError(f"SMTP {exc.smtp_code}", code=exc.smtp_code) from exc
        raise PermanentError(f"SMTP {exc.smtp_code}", code=exc.smtp_code) from exc
    except (smtplib.SMTPException, OSError) as exc:
        raise RetryableError(f"SMTP {config.host}:{config.port}: {type(exc).__name__}") from exc
    message_id = str(message["Message-ID"])
    log.info(
        "event=email_sent host=%s recipients=%d message_id=%s", config.host, len(to), message_id
    )
    return message_id


_HTML = Environment(autoescape=True).from_string(
    """<html><body style="font-family:sans-serif">
<h2 style="color:{{ colour }}">{{ title }}</h2>
{% if summary %}<p><b>{{ summary }}</b></p>{% endif %}
<table>{% for name, value in fields %}<tr><td><b>{{ name }}</b></td><td>{{ value }}</td></tr>
{% endfor %}</table>
{% if description %}<p>{{ description }}</p>{% endif %}
{% for name, url in links %}<a href="{{ url }}">{{ name }}</a> {% endfor %}
</body></html>"""
)
_COLOURS = {"P0": "#d83931", "P1": "#de7802", "P2": "#b88200", "P3": "#245bdb"}


def render_alert_email(kind: str, payload: NotificationPayload) -> tuple[str, str, str]:
    """(subject, text, html) for an alert or storm notification (pure)."""
    state = payload["status"].upper()
    name = alertname(payload) or ("alert storm" if "storm" in payload else "alert")
    job = job_of(payload)
    storm = payload.get("storm")
    if storm is not None:
        name = f"alert storm ({storm['total']} alerts)"
    subject = f"[{payload['priority']}] {state}: {name}" + (f" — {job}" if job else "")
    fields = [
        (label, value)
        for label, value in (
            ("Job", job), ("Rank", rank_of(payload)), ("Node", node_of(payload)),
            ("GPU", gpu_of(payload)), ("Value", annotation(payload, "value")),
            ("Since", payload.get("starts_at", "")), ("Reason", payload.get("reason", "")),
        )
        if value
    ]  # fmt: skip
    if storm is not None:
        fields += [
            (f"{n} ×", str(c)) for n, c in list((storm.get("by_alertname") or {}).items())[:20]
        ]
    links = [
        (label, url)
        for label, url in (
            ("Runbook", annotation(payload, "runbook_url")),
            ("Grafana", payload.get("grafana_url", "")),
            ("Source", payload.get("generator_url", "")),
        )
        if url
    ]
    summary = annotation(payload, "summary")
    description = annotation(payload, "description")
    text = "\n".join(
        [subject, "", *([summary, ""] if summary else []),
         *(f"{k}: {v}" for k, v in fields), "", *([description, ""] if description else []),
         *(f"{k}: {v}" for k, v in links)]
    )  # fmt: skip
    colour = "#2ea121" if payload["status"] == "resolved" else _COLOURS[payload["priority"]]
    html = _HTML.render(
        colour=colour, title=subject, summary=summary, fields=fields,
        description=description, links=links,
    )  # fmt: skip
    return subject, text, html


class EmailNotifier:
    """The `email` channel: one mail per notification to the addresses of its priority."""

    rate_limits: tuple[RateLimit, ...] = RATE_LIMITS

    def __init__(
        self,
        config: SmtpConfig,
        recipients: Mapping[Priority, Sequence[str]],
        *,
        name: str = CHANNEL,
    ) -> None:
        self.name = name
        self.config = config
        self.recipients = {p: list(addrs) for p, addrs in recipients.items()}

    @classmethod
    def from_settings(
        cls, settings: EmailSettings, env: Mapping[str, str] | None = None
    ) -> EmailNotifier:
        by_priority: dict[Priority, list[str]] = {}
        for address, priorities in settings.recipients.items():
            for priority in priorities:
                by_priority.setdefault(priority, []).append(address)
        return cls(SmtpConfig.from_settings(settings, env), by_priority)

    async def send(self, notification: OutboundNotification) -> Receipt:
        to = self.recipients.get(notification.priority)
        if not to:
            raise PermanentError(f"no email recipients for {notification.priority}")
        try:
            payload = parse_payload(notification.payload)
        except PayloadError as exc:
            raise PermanentError(str(exc)) from exc
        subject, text, html = render_alert_email(notification.kind, payload)
        message = build_message(self.config.sender, to, subject, text, html)
        message["X-Trainsentry-Key"] = notification.idempotency_key
        message_id = await send_email(self.config, message, to)
        return Receipt(channel=self.name, provider_id=message_id, detail={"recipients": len(to)})

    async def aclose(self) -> None:
        return None
