"""The tests run what production runs (issue 45): no test or benchmark imports a function or
class of the policy (`trainsentry/gateway/policy/`) that production does not use. Before,
the policy's tests drove `decide.decide`, which production never called (it plans through
`decide.fold_into` and `decide.flush`): a change could pass the policy's tests and change
nothing, or break production and pass. A test that needs one change planned uses
tests/gateway/policy/planned.py, which runs the production functions.

Used by production: imported from its module by another module of trainsentry/ (`from m
import name`, or `m.name` through an imported module), or named by its own module outside
its own definition. Read with the `ast` (a name in a docstring or comment is no use).
EXEMPT names what tests may import all the same, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"
POLICY = PACKAGE / "gateway" / "policy"
CONSUMERS = (ROOT / "tests", ROOT / "bench")

EXEMPT = {
    "trainsentry.gateway.policy.rules.merge_policy": (
        "builds a Policy over a loaded one (configuration, as load_policy's overrides do, which "
        "production uses); it decides nothing"
    ),
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> set[str]:
    return {_module(path) for path in PACKAGE.rglob("*.py")}


def _uses(path: Path, modules: set[str]) -> Iterator[tuple[str, str]]:
    """(module, name) for each name of another module that `path` imports or reaches
    through an imported module (`alias.name`)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:  # `from pkg import module`
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                else:
                    yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            yield aliases[node.value.id], node.attr


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """The module's public top-level functions and classes, by name."""
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("_")
    }


def _named_at_home(tree: ast.Module, name: str, definition: ast.AST) -> bool:
    """Whether the module names `name` outside its own definition."""
    inside = {id(node) for node in ast.walk(definition)}
    return any(
        isinstance(node, ast.Name) and node.id == name and id(node) not in inside
        for node in ast.walk(tree)
    )


def _test_only() -> dict[str, list[str]]:
    """Policy functions and classes a test or benchmark imports that production does not
    use -> the files that import them."""
    modules = _modules()
    used = {pair for path in PACKAGE.rglob("*.py") for pair in _uses(path, modules)}
    policy = {_module(path): path for path in POLICY.rglob("*.py")}
    found: dict[str, list[str]] = {}
    for folder in CONSUMERS:
        for path in sorted(folder.rglob("*.py")):
            for module, name in set(_uses(path, modules)):
                if module not in policy or (module, name) in used:
                    continue
                home = ast.parse(policy[module].read_text(), str(policy[module]))
                definition = _definitions(home).get(name)
                if definition is None or _named_at_home(home, name, definition):
                    continue
                found.setdefault(f"{module}.{name}", []).append(str(path.relative_to(ROOT)))
    return found


def test_no_test_imports_a_policy_entry_point_production_does_not_use() -> None:
    offenders = {name: files for name, files in _test_only().items() if name not in EXEMPT}
    assert not offenders, (
        "the tests drive policy functions production never calls (test what production "
        "runs: tests/gateway/policy/planned.py plans a change as the planner does; or use "
        "it in production, or delete it):\n"
        + "\n".join(f"{name}: {', '.join(files)}" for name, files in sorted(offenders.items()))
    )


def test_every_exemption_is_still_needed() -> None:
    found = _test_only()
    stale = [name for name in EXEMPT if name not in found]
    assert not stale, f"exempt, yet no longer test-only (drop them from EXEMPT): {stale}"
