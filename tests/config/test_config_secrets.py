"""A secret written into the YAML is refused without being repeated in the refusal.

Those refusals go to the gateway's and the report job's logs (pods, CronJobs), so the text
must name the setting, never its value.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SECRET = "Hunter2-Secret-Value"
CONFIGS = {
    "email password": {"channels": {"email": {"host": "h", "sender": "a@b", "password": SECRET}}},
    "webhook url with credentials": {
        "webhooks": {"pager": {"url": f"https://user:{SECRET}@pager.example/hook", "bogus": 1}}
    },
    "bot webhook url": {
        "channels": {
            "feishu_bot": {
                "groups": {
                    "ops": {
                        "priorities": ["P0"],
                        "url": f"https://open.feishu.cn/open-apis/bot/v2/hook/{SECRET}",
                    }
                }
            }
        }
    },
}


@pytest.mark.parametrize("command", ["gateway", "report"])
@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_refused_settings_never_echo_their_value(command: str, case: str, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIGS[case]))
    db = f"sqlite:///{tmp_path / 'store.db'}"
    argv = {
        "gateway": ["gateway", "--listen", "127.0.0.1:0", "--db", db, "--config", str(config)],
        "report": ["report", "render", "--db", db, "--config", str(config),
                   "--out", str(tmp_path / "r.html")],
    }[command]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "configuration error" in output
    assert SECRET not in output
