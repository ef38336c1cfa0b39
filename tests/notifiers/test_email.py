"""Email channel and sender against a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import Iterator
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.support.ports import free_port
from trainsentry.alerts import Priority
from trainsentry.config.channels import EmailSettings
from trainsentry.notifiers.base import PermanentError, RetryableError
from trainsentry.notifiers.email import (
    Attachment,
    EmailNotifier,
    SmtpConfig,
    build_message,
    send_email,
)

from .helpers import alert_payload, notification

USER, PASSWORD = "alerts@example.com", "smtp-pass"


class Inbox:
    def __init__(self) -> None:
        self.mails: list[tuple[str, list[str], Any]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = message_from_bytes(envelope.original_content, policy=policy.default)
        self.mails.append((envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return "250 OK"


def _authenticator(
    server: Any, session: Any, envelope: Any, mechanism: str, data: Any
) -> AuthResult:
    ok = (
        isinstance(data, LoginPassword)
        and data.login == USER.encode()
        and data.password == PASSWORD.encode()
    )
    return AuthResult(success=ok, handled=False)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)  # noqa: E501
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )  # fmt: skip
    return cert_path, key_path


def _server_context(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls_files)
    return context


def _client_context(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_files[0]))


@pytest.fixture
def smtp_starttls(tls_files: tuple[Path, Path]) -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(
        inbox, hostname="127.0.0.1", port=port, tls_context=_server_context(tls_files),
        require_starttls=True, authenticator=_authenticator, auth_required=True,
    )  # fmt: skip
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


async def test_starttls_auth_delivery_with_html_and_attachment(
    smtp_starttls: tuple[Inbox, int], tls_files: tuple[Path, Path]
) -> None:
    inbox, port = smtp_starttls
    config = SmtpConfig("127.0.0.1", port, USER, "starttls", USER, PASSWORD,
                        ssl_context=_client_context(tls_files))  # fmt: skip
    message = build_message(
        USER, ["team@example.com", "lead@example.com"], "Weekly report", "plain body",
        html="<p>html body</p>", attachments=[Attachment("alerts.csv", b"a,b\n1,2\n", "text/csv")],
    )  # fmt: skip
    message_id = await send_email(config, message)
    [(sender, rcpts, mail)] = inbox.mails
    assert sender == USER and rcpts == ["team@example.com", "lead@example.com"]
    assert mail["Subject"] == "Weekly report" and mail["Message-ID"] == message_id
    assert mail.get_body(("plain",)).get_content().strip() == "plain body"
    assert "html body" in mail.get_body(("html",)).get_content()
    [attachment] = list(mail.iter_attachments())
    assert attachment.get_filename() == "alerts.csv" and attachment.get_content() == "a,b\n1,2\n"


async def test_wrong_password_is_permanent(
    smtp_starttls: tuple[Inbox, int], tls_files: tuple[Path, Path]
) -> None:
    inbox, port = smtp_starttls
    config = SmtpConfig("127.0.0.1", port, USER, "starttls", USER, "wrong",
                        ssl_context=_client_context(tls_files))  # fmt: skip
    with pytest.raises(PermanentError, match="authentication"):
        await send_email(config, build_message(USER, ["a@example.com"], "s", "t"))
    untrusted = SmtpConfig("127.0.0.1", port, USER, "starttls", USER, PASSWORD)  # default CAs
    with pytest.raises(RetryableError):
        await send_email(untrusted, build_message(USER, ["a@example.com"], "s", "t"))
    assert inbox.mails == []


async def test_implicit_tls(tls_files: tuple[Path, Path]) -> None:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port,
                            ssl_context=_server_context(tls_files))  # fmt: skip
    controller.start()
    try:
        config = SmtpConfig("127.0.0.1", port, USER, "tls", ssl_context=_client_context(tls_files))
        await send_email(config, build_message(USER, ["b@example.com"], "tls", "over tls"))
    finally:
        controller.stop()
    assert [m[2]["Subject"] for m in inbox.mails] == ["tls"]


async def test_email_channel_renders_the_alert() -> None:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        settings = EmailSettings.model_validate(
            {"host": "127.0.0.1", "port": port, "security": "none", "sender": USER,
             "recipients": {"oncall@example.com": ["P0", "P1"], "boss@example.com": ["P0"]}}
        )  # fmt: skip
        notifier = EmailNotifier.from_settings(settings, env={})
        payload = alert_payload("P0")
        payload["annotations"]["summary"] = "XID <79> & friends"
        receipt = await notifier.send(notification(5, payload, channel="email"))
        with pytest.raises(PermanentError, match="no email recipients"):
            await notifier.send(notification(6, alert_payload("P3"), channel="email"))
    finally:
        controller.stop()
    [(_, rcpts, mail)] = inbox.mails
    assert sorted(rcpts) == ["boss@example.com", "oncall@example.com"]
    assert mail["Subject"] == "[P0] FIRING: GpuXidError — team-a/llama-70b"
    assert mail["X-Trainsentry-Key"] == "test:5" and receipt.provider_id == mail["Message-ID"]
    text = mail.get_body(("plain",)).get_content()
    assert "Node: gpu-node-07" in text and "Runbook: https://runbooks.example/gpu-xid" in text
    html = mail.get_body(("html",)).get_content()
    assert "XID &lt;79&gt; &amp; friends" in html and "#d83931" in html


async def test_connection_refused_is_retryable() -> None:
    config = SmtpConfig("127.0.0.1", free_port(), USER, "none", timeout_s=2)
    with pytest.raises(RetryableError):
        await send_email(config, build_message(USER, ["a@example.com"], "s", "t"))


def test_priority_type_is_used() -> None:
    notifier = EmailNotifier(SmtpConfig("h", 25, USER), {Priority.P0: ["x@example.com"]})
    assert notifier.recipients == {Priority.P0: ["x@example.com"]}
    assert "smtp-pass" not in repr(SmtpConfig("h", 25, USER, password="smtp-pass"))


async def test_a_server_trickling_its_answers_is_cut_at_the_timeout() -> None:
    """timeout_s bounds the whole session, not each read: a greeting sent one byte every
    0.3 s (each read well within 1.5 s) ends the send at 1.5 s, worker thread included."""
    import asyncio
    import socket as sockets
    import threading
    import time

    listener = sockets.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    closed = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        try:
            for byte in b"220 slow.example ESMTP ready\r\n" * 10:
                conn.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            closed.set()  # the client cut the session
        finally:
            conn.close()

    server = threading.Thread(target=trickle, daemon=True)
    server.start()
    config = SmtpConfig("127.0.0.1", port, "alerts@example.com", security="none", timeout_s=1.5)
    message = build_message(config.sender, ["oncall@example.com"], "s", "t")
    started = time.monotonic()
    with pytest.raises(RetryableError):
        await send_email(config, message)
    took = time.monotonic() - started
    listener.close()
    assert 1.5 <= took < 3.0
    assert await asyncio.to_thread(closed.wait, 5.0)
