"""One idea, one home (issue 45): what several modules need is written once, where it
belongs, and used from there; a second spelling drifts from the first.

- the store failures a caller catches: `store/errors.py` `STORE_FAILURES`, never the
  tuple spelled again (it was, 14 times);
- a presented secret compared with the expected one: `credentials.secrets_equal`, shared by
  the gateway's authentication and the Feishu channel (it lived in the Feishu package, and
  the gateway's authentication imported it from there);
- an id in a request's path: `gateway/api/path_ids.py` `parse_id`, one bound for the API and
  the console (5 places parsed them, with two bounds: 18 digits, or 1 to 2**63-1).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"


def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def test_store_failures_are_caught_as_the_one_tuple() -> None:
    """No `except (OSError, DatabaseError)` nor `isinstance(exc, DatabaseError | OSError)`
    outside store/errors.py: a caller catches `STORE_FAILURES`."""
    spelled = []
    for where, tree in _modules().items():
        if where == "trainsentry/store/errors.py":
            continue
        for node in ast.walk(tree):
            caught = None
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = node.type
            elif isinstance(node, ast.Call) and _names(node.func) == {"isinstance"}:
                caught = node.args[1] if len(node.args) == 2 else None
            if caught is not None and {"OSError", "DatabaseError"} <= _names(caught):
                spelled.append(f"{where}:{node.lineno}")
    assert not spelled, f"catch STORE_FAILURES (store/errors.py) instead: {spelled}"


def test_the_gateway_and_the_channels_compare_secrets_in_one_place() -> None:
    """`hmac.compare_digest` only in credentials.py among the gateway and the channels (the
    probe and the operator are parts of their own, importing nothing of the gateway's)."""
    found = []
    for where, tree in _modules().items():
        if not where.startswith(("trainsentry/gateway/", "trainsentry/notifiers/")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "compare_digest":
                found.append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.FunctionDef) and node.name in {"secrets_equal", "wire_bytes"}:
                found.append(f"{where}:{node.lineno} defines {node.name}")
    assert not found, f"compare secrets with credentials.secrets_equal instead: {found}"


def test_path_ids_are_parsed_in_one_place() -> None:
    """No function of the gateway but path_ids.py's reads digits itself from a path's
    `request.match_info`: it calls `parse_id`."""
    found = []
    for where, tree in _modules().items():
        if not where.startswith("trainsentry/gateway/") or where.endswith("/path_ids.py"):
            continue
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            calls = {
                node.func.attr
                for node in ast.walk(function)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            }
            reads_path = any(
                isinstance(node, ast.Attribute) and node.attr == "match_info"
                for node in ast.walk(function)
            )
            if reads_path and "isdigit" in calls:
                found.append(f"{where}:{function.lineno} {function.name}")
    assert not found, f"parse a path's id with path_ids.parse_id instead: {found}"
