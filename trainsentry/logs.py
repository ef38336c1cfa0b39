"""Structured logging: key=value lines on stderr, one place to configure it.

Invariant: no secret reaches a log line. Webhook URLs carry their credential (a Feishu bot's
token is the last path segment; pager and voice URLs often hold a key in the query), so
third-party loggers that write request URLs or headers are held at WARNING whatever the
process's level: httpx logs every request's full URL at INFO, httpcore and hpack (HTTP/2)
trace requests and headers at DEBUG, urllib3 logs URLs at DEBUG; aiohttp's access log writes
each served path at INFO (the operator's admission webhook path holds its token), and the
Kubernetes client logs response bodies at DEBUG (a Secret's data). Our own log lines name a
channel or webhook group, never its URL (tests/notifiers/test_log_secrets.py greps every
line of a real gateway's log for the secrets it was given, at INFO and DEBUG).
"""

from __future__ import annotations

import logging
import sys

# Loggers that print request URLs, query strings or headers below WARNING.
URL_LOGGERS = (
    "httpx",
    "httpcore",
    "hpack",
    "h2",
    "urllib3",
    "aiohttp.client",
    "aiohttp.access",
    "kubernetes_asyncio.client.rest",
)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().replace("\n", "\\n")
        line = (
            f"ts={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} level={record.levelname.lower()} "
            f"logger={record.name} msg={message!r}"
        )
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


def quiet_url_loggers() -> None:
    """Holds the loggers in URL_LOGGERS at WARNING (idempotent; any process that configures
    logging calls it, whatever level it chose for the rest)."""
    for name in URL_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_url_loggers()
