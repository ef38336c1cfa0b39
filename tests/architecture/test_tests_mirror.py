"""Tests mirror the package (docs/architecture.md, "Where to add"): a test module lives in the
folder of tests/ that has the path of the trainsentry/ folder holding the code it tests, so
`tests/gateway/stages/` tests `trainsentry/gateway/stages/`. Test modules directly in tests/
test top-level modules of the package (`cli.py`, `logs.py`, ...).

The folders in EXEMPT test something other than one folder of the package; each says what.
Folders with no test modules (support/: helpers and real servers shared by the tests and the
benchmarks; data/ and fixtures/: recorded inputs) need no exemption.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "trainsentry"

EXEMPT = {
    "architecture": "the layout of the whole repository (this module, test_layout.py)",
    "chart": "the Helm chart, charts/ at the repository root",
    "e2e": "the whole product end to end: real servers, every part at once",
    "rules": "the Prometheus rule files, rules/ at the repository root",
}


def _misplaced() -> list[str]:
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        folder = path.parent.relative_to(TESTS)
        if folder.parts and folder.parts[0] in EXEMPT:
            continue
        if not (PACKAGE / folder).is_dir():
            misplaced.append(
                f"{path.relative_to(ROOT)}: trainsentry/{folder.as_posix()}/ does not exist"
            )
    return misplaced


def test_every_test_module_is_in_a_folder_the_package_has() -> None:
    misplaced = _misplaced()
    assert not misplaced, (
        "test modules outside the package's folders (move each beside the code it tests, "
        "or add its folder to EXEMPT with a reason):\n" + "\n".join(misplaced)
    )


def test_every_exempt_folder_holds_tests_and_is_not_a_folder_of_the_package() -> None:
    for folder in EXEMPT:
        assert list((TESTS / folder).rglob("test_*.py")), f"tests/{folder}/ is exempt: no tests"
        assert not (PACKAGE / folder).is_dir(), (
            f"trainsentry/{folder}/ exists: its tests must mirror it, not be exempt"
        )
