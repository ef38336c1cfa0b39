"""Logging setup (trainsentry/logs.py): the loggers that print request URLs stay at WARNING
whatever level a process picks, so webhook tokens in URLs never reach a log line."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from trainsentry.logs import URL_LOGGERS, configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in URL_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_url_loggers_are_held_at_warning(level: str, restore_logging: None) -> None:
    configure_logging(level)
    assert logging.getLogger().level == getattr(logging, level)
    for name in ("httpx", "httpcore", "httpcore.http11", "hpack", "urllib3"):
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO), name
        assert logger.isEnabledFor(logging.WARNING), name
    assert logging.getLogger("trainsentry.outbox").isEnabledFor(getattr(logging, level))
