"""The `Gateway` is built whole (issue 45, "one planning path"; docs/architecture.md, "The
gateway pipeline"): `gateway/assemble.py` constructs it once with every part present, and
nothing assigns to it afterwards. A feature that is off is an explicit absent value
(`gateway/absent.py`: an `Off` part with the same lifecycle, doing nothing), never `None`
checked where the part is used.

- no assignment `gateway.<field> = ...` anywhere (the dataclass is frozen: it would fail at
  run time, this says where before it runs);
- no `gateway.<field> is None` / `is not None` (nor `gateway.<field> or ...`) outside
  assemble.py, counting a local that holds a field (`service = gateway.maintenance`) and the
  Gateway's own methods (`self.<field>`). There were 49 before the change.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from trainsentry.gateway.pipeline import Gateway

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"
FIELDS = frozenset(field.name for field in dataclasses.fields(Gateway))
ASSEMBLE = "trainsentry/gateway/assemble.py"
PIPELINE = "trainsentry/gateway/pipeline.py"
HOLDERS = frozenset({"gateway", "gw", "g"})  # the names a Gateway goes by in the code


def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _holds_gateway(node: ast.expr, where: str) -> bool:
    """`gateway`, `gw`, `g`, `x.gateway`, `app[GATEWAY_KEY]`, and `self` in pipeline.py."""
    if isinstance(node, ast.Name):
        return node.id in HOLDERS or (node.id == "self" and where == PIPELINE)
    if isinstance(node, ast.Attribute):
        return node.attr == "gateway"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Name) and node.slice.id == "GATEWAY_KEY"
    return False


def _field_of(node: ast.AST, where: str) -> str | None:
    """The Gateway field `node` reads (`gateway.cordon` → "cordon"), or None."""
    if (
        isinstance(node, ast.Attribute)
        and node.attr in FIELDS
        and _holds_gateway(node.value, where)
    ):
        return node.attr
    return None


def _aliases(function: ast.AST, where: str) -> set[str]:
    """The locals of `function` assigned a Gateway field (`a, b = gateway.x, gateway.y`)."""
    names: set[str] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign | ast.NamedExpr):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            pairs: list[tuple[ast.expr, ast.expr]] = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts, strict=False))
            for name, value in pairs:
                if isinstance(name, ast.Name) and _field_of(value, where) is not None:
                    names.add(name.id)
    return names


def _none_checks(tree: ast.Module, where: str) -> list[str]:
    """`<field> is None`, `<field> is not None` and `<field> or ...` on a Gateway field or a
    local holding one."""
    found = []
    scopes = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
    ]
    seen: set[int] = set()
    for scope in [tree, *scopes]:
        aliases = _aliases(scope, where) if scope is not tree else set()

        def checked(node: ast.expr, aliases: set[str] = aliases) -> bool:
            return _field_of(node, where) is not None or (
                isinstance(node, ast.Name) and node.id in aliases
            )

        for node in ast.walk(scope):
            if id(node) in seen and not aliases:
                continue
            hit = False
            if isinstance(node, ast.Compare) and len(node.ops) == 1:
                pair = (node.left, node.comparators[0])
                if isinstance(node.ops[0], ast.Is | ast.IsNot) and any(
                    isinstance(side, ast.Constant) and side.value is None for side in pair
                ):
                    hit = any(checked(side) for side in pair)
            elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
                hit = checked(node.values[0])
            if hit and id(node) not in seen:
                seen.add(id(node))
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_gateway_field_is_assigned() -> None:
    """The Gateway is complete when assemble.py constructs it: no `gateway.<field> = ...`."""
    assigned = []
    for where, tree in _modules().items():
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (field := _field_of(part, where)) is not None and part is target:
                        assigned.append(f"{where}:{node.lineno}: gateway.{field}")
    assert not assigned, f"construct the Gateway whole in assemble.py instead: {assigned}"


def test_the_gateway_is_frozen() -> None:
    params = Gateway.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen, "Gateway must be a frozen dataclass: built once, by assemble.py"


def test_no_gateway_part_is_checked_for_none() -> None:
    """An off part is an explicit absent value (gateway/absent.py), not None checked at use."""
    found = [
        check
        for where, tree in _modules().items()
        if where != ASSEMBLE
        for check in _none_checks(tree, where)
    ]
    assert not found, (
        f"{len(found)} None checks of the Gateway's parts (make the part always present, "
        "its off case an absent value of gateway/absent.py):\n" + "\n".join(found)
    )
