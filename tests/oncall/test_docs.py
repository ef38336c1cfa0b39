"""docs/oncall.md's example is the one the tests use, and its `oncall now` output is what the
real command prints for it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from oncall_helpers import EXAMPLE, run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "oncall.md"


def block(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```[a-z]*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/oncall.md lost its {marker} block"
    return match.group(1)


def test_the_documented_example_is_the_tested_one() -> None:
    assert yaml.safe_load(block("oncall-example")) == yaml.safe_load(EXAMPLE.read_text())


def test_the_documented_output_is_what_the_command_prints(tmp_path: Path) -> None:
    command, _, shown = block("oncall-now").partition("\n")
    args = command.split()
    assert args[:4] == ["$", "trainsentry", "oncall", "now"]
    config = tmp_path / "oncall.yaml"
    config.write_text(block("oncall-example"))
    args[args.index("--config") + 1] = str(config)
    code, out, err = run_cli(*args[3:])
    assert code == 0, err
    assert json.loads(out) == json.loads(shown)
    assert out == shown
