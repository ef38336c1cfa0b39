"""The console in the real `trainsentry gateway` process, configured by its YAML file: the
`gateway.console` section reaches it (a trusted proxy's user header), and a bad one is a
config error naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gateway_process import start_gateway
from tests.support.raw_http import raw_request

pytestmark = pytest.mark.e2e


def test_the_console_section_of_the_config_file_reaches_the_console(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "gateway:\n  console:\n    trusted_proxies: [127.0.0.1/32]\n    user_header: X-Who\n"
    )
    db = f"sqlite:///{tmp_path / 'store.db'}"
    with start_gateway(tmp_path, db, token="tok-1", config=config) as gateway:
        assert raw_request(gateway.port, "GET", "/ui/").status == 303  # sign in first
        answer = raw_request(gateway.port, "GET", "/ui/", [("X-Who", "ivan")])
        assert answer.status == 200 and b"ivan" in answer.body
        assert "default-src 'none'" in answer.headers.get("content-security-policy", "")


def test_a_bad_proxy_address_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("gateway:\n  console:\n    trusted_proxies: [not-an-address]\n")
    result = subprocess.run(
        [sys.executable, "-m", "trainsentry", "gateway", "--config", str(config),
         "--db", f"sqlite:///{tmp_path / 's.db'}", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "gateway.console.trusted_proxies" in output and "Traceback" not in output
