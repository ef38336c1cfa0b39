"""The gateway's public face (issue 45): a module of trainsentry/ outside gateway/ uses the
gateway only through `trainsentry.gateway.public` (the running gateway, for demo/) and the
package `trainsentry.gateway.policy` (the policy's rules and node health, for reports/);
every other module of gateway/ is the gateway's own, free to move and change. Read with the
`ast`, imports inside functions included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"
GATEWAY = PACKAGE / "gateway"
FACES = frozenset({"trainsentry.gateway.public", "trainsentry.gateway.policy"})


def gateway_imports(source: str) -> Iterator[str]:
    """The gateway modules `source` imports (`import m`, `from m import name`; a name that
    is itself a module counts as that module)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "trainsentry.gateway":
                yield from (f"trainsentry.gateway.{alias.name}" for alias in node.names)
            elif node.module.startswith("trainsentry.gateway."):
                yield node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trainsentry.gateway"):
                    yield alias.name


def private_uses(source: str) -> list[str]:
    return sorted({m for m in gateway_imports(source) if m not in FACES})


def test_outside_the_gateway_only_its_faces_are_imported() -> None:
    found = {
        path.relative_to(ROOT).as_posix(): uses
        for path in PACKAGE.rglob("*.py")
        if GATEWAY not in path.parents and (uses := private_uses(path.read_text()))
    }
    assert not found, (
        "modules outside trainsentry/gateway/ import gateway modules that are not its public "
        "face (add what they need to gateway/public.py or gateway/policy/__init__.py): "
        f"{found}"
    )


def test_the_check_sees_private_imports_wherever_they_are() -> None:
    planted = (
        "from trainsentry.gateway.public import create_app\n"
        "from trainsentry.gateway.policy import Policy\n"
        "from trainsentry.gateway import assemble\n"
        "import trainsentry.gateway.pipeline\n"
        "def later():\n"
        "    from trainsentry.gateway.policy.rules import load_policy\n"
    )
    assert private_uses(planted) == [
        "trainsentry.gateway.assemble",
        "trainsentry.gateway.pipeline",
        "trainsentry.gateway.policy.rules",
    ]


def test_the_faces_exist_and_say_what_they_hold() -> None:
    for face in FACES:
        path = ROOT / (face.replace(".", "/") + ".py")
        path = path if path.exists() else path.with_suffix("") / "__init__.py"
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), face
        exported = next(
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        )
        assert isinstance(exported, ast.List) and exported.elts, face
