"""constraints.txt pins every dependency the tests run with, at the version they ran with.

scripts/install-deps.sh and the Quick start install with `-c constraints.txt`; a dependency
added to pyproject.toml without re-running scripts/update-constraints.sh would be installed
at whatever version PyPI offers that day, untested. This walks trainsentry's requirements
(with the test and probe extras) through the installed distributions.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"


def pinned() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def required_closure(root: str, extras: tuple[str, ...]) -> set[str]:
    """Canonical names of every installed distribution `root[extras]` needs, transitively."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        for text in metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            environments = [{"extra": extra} for extra in ("", *wanted)]
            if marker is not None and not any(marker.evaluate(env) for env in environments):
                continue
            child = canonicalize_name(requirement.name)
            if child not in seen:
                seen.add(child)
                todo.append((child, tuple(requirement.extras)))
    return seen


def test_every_dependency_is_pinned_at_its_installed_version() -> None:
    pins = pinned()
    needed = required_closure("trainsentry", ("test", "probe"))
    assert {"sqlalchemy", "aiosqlite", "ruff", "mypy", "torch"} <= needed
    missing = sorted(name for name in needed if name not in pins)
    assert missing == [], f"not in constraints.txt (scripts/update-constraints.sh): {missing}"
    # A local label (torch's +cpu) names the build, not the version.
    drifted = {
        name: (str(pins[name]), metadata.version(name))
        for name in needed
        if Version(metadata.version(name)).public != str(pins[name])
    }
    assert drifted == {}, f"installed versions differ from constraints.txt: {drifted}"
