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


def test_the_escalation_worked_example_is_what_the_escalation_does() -> None:
    from datetime import datetime, timedelta

    from trainsentry.alerts import Priority
    from trainsentry.gateway.policy.escalation import IncidentPage, batch, new_state, plan
    from trainsentry.gateway.policy.roster import escalator_of
    from trainsentry.oncall.config import parse_oncall

    raw = yaml.safe_load(block("oncall-example"))["oncall"]
    raw |= yaml.safe_load(block("oncall-escalation"))["oncall"]
    config = parse_oncall(raw)
    esc = escalator_of(config.escalation_policies["gpu-p0"], config)
    start = datetime.fromisoformat("2026-10-27T13:00:00+01:00")
    kwargs = {"roster": esc.roster, "policy": esc.policy, "named": {"gpu-p0": esc}}
    page = IncidentPage(1, Priority.P0, "x", "gpu-p0")
    state, due = batch(new_state(), start, pages=[page], **kwargs)
    calls = [(0, c.person.name, c.layer) for c in due]
    for minute in range(1, 200):
        state, due = plan(state, start + timedelta(minutes=minute), **kwargs)
        calls += [(minute, c.person.name, c.layer) for c in due]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in block_table("oncall-escalation-calls")
    ]
    shown = [(int(m), who, step.split(",")[0]) for m, who, step in rows if m.isdigit()]
    assert calls[:8] == shown[:8]
    assert calls[-1] == shown[-1]
    assert [m for m, _, _ in calls[7:]] == list(range(60, 121, 5))
    assert {(who, step) for _, who, step in calls[6:]} == {("alice", "lead")}


def block_table(marker: str) -> list[str]:
    text = DOC.read_text()
    after = text[text.index(f"<!-- {marker} -->") :].splitlines()[1:]
    table = []
    for line in after:
        if not line.startswith("|"):
            break
        table.append(line)
    return table[2:]
