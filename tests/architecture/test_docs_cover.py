"""docs/architecture.md covers every module: its "Modules" section has one line per module of
trainsentry/ (`__init__.py` files aside), `- \\`path\\`: what it is for`, and no line for a
module that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"
DOC = ROOT / "docs" / "architecture.md"
LINE = re.compile(r"- `([\w/]+\.py)`: (\S.*)")


def _documented() -> dict[str, str]:
    """The Modules section: module path (relative to trainsentry/) -> its line's text."""
    text = DOC.read_text()
    assert "\n## Modules\n" in text, "docs/architecture.md has no '## Modules' section"
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return {m[1]: m[2] for line in section.splitlines() if (m := LINE.fullmatch(line.strip()))}


def _modules() -> list[str]:
    return sorted(
        p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
    )


def test_every_module_has_its_line() -> None:
    documented = _documented()
    missing = [f"trainsentry/{m}" for m in _modules() if m not in documented]
    assert not missing, (
        "modules without a line in docs/architecture.md's Modules section "
        "(add `- `path`: what it is for`, from the module's docstring): " + ", ".join(missing)
    )


def test_every_line_names_a_module_that_exists() -> None:
    stale = sorted(set(_documented()) - set(_modules()))
    assert not stale, f"docs/architecture.md's Modules section names missing modules: {stale}"
