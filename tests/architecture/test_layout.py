"""The layout docs/architecture.md promises: parts, allowed imports, no cycles, SQL only in
the store, a pure policy, module sizes, and the gateway's stage folders.

Imports are read with the `ast` from every module of trainsentry/, wherever they stand
(function-local imports included), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"
DOC = ROOT / "docs" / "architecture.md"
MAX_LINES = 500


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted (for `from a import b`: "a.b" and "a")
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path) -> list[Import]:
    module = _module_name(path)
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(Import(module, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            found.append(Import(module, source, node.lineno))
            found.extend(Import(module, f"{source}.{a.name}", node.lineno) for a in node.names)
    return found


def _all_imports() -> list[Import]:
    return [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in _imports_of(path)]


def _part(module: str) -> str | None:
    """trainsentry.gateway.stages.outbox -> gateway; trainsentry.alerts -> alerts."""
    parts = module.split(".")
    if parts[0] != "trainsentry" or len(parts) < 2 or parts[1].startswith("__"):
        return None  # the package root (`from trainsentry import __version__`)
    return parts[1]


def _part_edges() -> dict[tuple[str, str], list[Import]]:
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    known = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    for imp in _all_imports():
        source, target = _part(imp.module), _part(imp.target)
        if source is None or target is None or source == target or target not in known:
            continue  # `from trainsentry.x import name` also yields "trainsentry.x.name"
        edges[source, target].append(imp)
    return edges


def _documented_parts() -> dict[str, set[str]]:
    """The parts table of docs/architecture.md: part -> the parts it may import."""
    table: dict[str, set[str]] = {}
    section = DOC.read_text().split("## Parts", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        allowed = set(re.findall(r"`([a-z_]+)`", cells[2].split("(")[0]))
        table[cells[0].strip("`")] = allowed
    return table


def _parts_in_code() -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and not p.stem.startswith("__"))
        or (p.is_dir() and (p / "__init__.py").exists())
    }


def _where(imports: list[Import]) -> str:
    return ", ".join(f"{i.module}:{i.line} imports {i.target}" for i in imports[:3])


def test_the_parts_table_names_every_part() -> None:
    documented = _documented_parts()
    assert "gateway" in documented and "store" in documented  # the table was found
    missing = _parts_in_code() - set(documented)
    assert not missing, f"parts missing from docs/architecture.md's table: {sorted(missing)}"


def test_every_import_between_parts_is_allowed() -> None:
    documented = _documented_parts()
    wrong = {
        (source, target): imports
        for (source, target), imports in _part_edges().items()
        if target not in documented.get(source, set())
    }
    assert not wrong, "imports docs/architecture.md does not allow: " + "; ".join(
        f"{s} -> {t} ({_where(i)})" for (s, t), i in sorted(wrong.items())
    )


def test_no_import_cycle_between_parts() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in _part_edges():
        graph[source].add(target)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles between parts: {cycles}"


SHARED_WITH_THE_PROBE = ("trainsentry.probe.ras_report", "trainsentry.probe.ras_verdict")


def test_diagnostics_imports_only_the_ras_modules_of_the_probe() -> None:
    from_diagnostics = _part_edges().get(("diagnostics", "probe"), [])
    wrong = [
        i
        for i in from_diagnostics
        if not any(i.target == m or i.target.startswith(m + ".") for m in SHARED_WITH_THE_PROBE)
    ]
    assert not wrong, _where(wrong)
    assert not [e for e in _part_edges() if e[0] == "probe"], "probe imports another part"


# What the operator and the gateway may take from the probe (docs/architecture.md): the
# per-job token and, for the operator's webhook, the injected probe's layout.
FROM_THE_PROBE = {
    "operator": ("trainsentry.probe.token", "trainsentry.probe.inject"),
    "gateway": ("trainsentry.probe.token",),
}


@pytest.mark.parametrize("part", sorted(FROM_THE_PROBE))
def test_operator_and_gateway_import_only_the_probes_shared_modules(part: str) -> None:
    allowed = FROM_THE_PROBE[part]
    wrong = [
        i
        for i in _part_edges().get((part, "probe"), [])
        if i.target != "trainsentry.probe"  # `from trainsentry.probe import token` names both
        and not any(i.target == m or i.target.startswith(m + ".") for m in allowed)
    ]
    assert not wrong, _where(wrong)


# The on-call rota is parsed by its own part, which imports no settings (docs/architecture.md).
FROM_THE_ONCALL_PART = ("trainsentry.oncall.config", "trainsentry.oncall.types")


def test_config_imports_only_the_oncall_parser_and_types() -> None:
    wrong = [
        i
        for i in _part_edges().get(("config", "oncall"), [])
        if not any(i.target == m or i.target.startswith(m + ".") for m in FROM_THE_ONCALL_PART)
    ]
    assert not wrong, _where(wrong)


def test_only_the_store_imports_sqlalchemy() -> None:
    offenders = [
        i
        for i in _all_imports()
        if i.target.split(".")[0] == "sqlalchemy" and _part(i.module) != "store"
    ]
    assert not offenders, _where(offenders)


# Beside kube/, only the operator's kopf login and handlers touch the client library: they
# build the one ApiClient configuration that kopf and `Kube` share.
BUILDS_THE_KUBERNETES_CLIENT = ("trainsentry.operator.login", "trainsentry.operator.handlers")


def test_only_the_kube_part_talks_to_kubernetes() -> None:
    offenders = [
        i
        for i in _all_imports()
        if i.target.split(".")[0] in ("kubernetes_asyncio", "kubernetes")
        and _part(i.module) != "kube"
        and i.module not in BUILDS_THE_KUBERNETES_CLIENT
    ]
    assert not offenders, _where(offenders)


def test_the_policy_is_pure() -> None:
    io_libraries = {"aiohttp", "httpx", "sqlalchemy", "kubernetes_asyncio"}
    forbidden_inside = (
        "trainsentry.gateway.stages",
        "trainsentry.gateway.app",
        "trainsentry.store",
    )
    offenders = [
        i
        for i in _all_imports()
        if i.module.startswith("trainsentry.gateway.policy")
        and (
            i.target.split(".")[0] in io_libraries
            or any(i.target == f or i.target.startswith(f + ".") for f in forbidden_inside)
        )
    ]
    assert not offenders, _where(offenders)


# The dump readers are exempt (docs/architecture.md).
SIZED = [
    p for p in sorted(PACKAGE.rglob("*.py")) if PACKAGE / "diagnostics" / "readers" not in p.parents
]


@pytest.mark.parametrize("path", SIZED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


def test_the_gateway_has_folders_that_name_its_stages() -> None:
    gateway = PACKAGE / "gateway"
    for folder in ("policy", "stages", "stages/planning", "commands"):
        assert (gateway / folder / "__init__.py").exists(), folder
    for stage in ("intake", "outbox", "paging", "ack", "diagnosis", "hang_trigger"):
        assert (gateway / "stages" / f"{stage}.py").exists(), stage
    for step in ("rules", "classify", "dedup", "storm", "route", "escalation", "decide"):
        assert (gateway / "policy" / f"{step}.py").exists(), step
    assert (gateway / "assemble.py").exists()
    # every folder and module the page's pipeline drawing names exists
    drawing = DOC.read_text().split("## The gateway pipeline", 1)[1].split("\n## ", 1)[0]
    for name in set(
        re.findall(r"\b((?:gateway|stages|store|notifiers)/[\w/]*\w(?:\.py)?)", drawing)
    ):
        target = PACKAGE / name if name.startswith(("gateway", "store", "notifiers")) else None
        if target is None:
            target = gateway / name
        assert target.exists(), f"docs/architecture.md names {name}, which does not exist"
