"""The layout docs/architecture.md promises: parts, allowed imports, no cycles, SQL only in
the store, a pure policy, cohesion (no private names across modules, no circle inside a part,
a module over 600 lines says why it is one piece), and the gateway's stage folders.

Imports are read with the `ast` from every module of trainsentry/, wherever they stand
(function-local imports included), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainsentry"
DOC = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted (for `from a import b`: "a.b" and "a")
    line: int


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parse(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per version of the file (its size and time of
    change): a dozen rules read every module of the package. Callers only read the tree."""
    stat = path.stat()
    return _parse_version(str(path), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parse_version(path: str, _mtime_ns: int, _size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(), path)


def _imports_of(path: Path) -> tuple[Import, ...]:
    """What the module imports, read once per version of the file (as `_parse`)."""
    stat = path.stat()
    return _imports_of_version(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _imports_of_version(path: Path, _mtime_ns: int, _size: int) -> tuple[Import, ...]:
    module = _module_name(path)
    found: list[Import] = []
    for node in ast.walk(_parse(path)):
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
    return tuple(found)


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
        "trainsentry.gateway.api.app",
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


def test_the_gateway_has_folders_that_name_its_stages() -> None:
    gateway = PACKAGE / "gateway"
    folders = ("policy", "stages", "stages/planning", "stages/hang", "stages/services", "api", "ui")
    for folder in (*folders, "commands"):
        assert (gateway / folder / "__init__.py").exists(), folder
    for stage in ("intake", "outbox", "services/paging", "services/ack", "hang/diagnosis"):
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


# Cohesion (docs/architecture.md, "Also enforced"). Each rule is a function of a package
# folder, so it is tested twice: on a tree with a planted violation (it must fail there) and
# on trainsentry/.

LONG_MODULE = 600  # lines; a longer module says why it is one piece
LONG_FUNCTION = 80  # lines, decorators left out; a longer function says why it is one piece
ONE_PIECE = "One piece:"  # ... on a line of its own module's or function's docstring


def _modules(package: Path) -> dict[str, Path]:
    """Every module of `package`, by dotted name (`pkg.a.b`; a package by its folder's)."""
    return {_module_name(path, package.parent): path for path in sorted(package.rglob("*.py"))}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _import_source(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The dotted module a `from ... import` reads, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _dotted(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


@dataclass(frozen=True, order=True)
class PrivateUse:
    module: str  # the module that uses it
    name: str  # the private name, dotted: "trainsentry.x._y"

    def __str__(self) -> str:
        return f"{self.module} uses {self.name}"


def _private_uses(package: Path) -> set[PrivateUse]:
    """Where a module of `package` takes another module's private (`_name`, not dunder) name:
    `from x import _y` (relative too), or `m._y` / `a.b.x._y` on a name bound to a module of
    `package` by an import. Only the package's own modules count: a third-party private
    (`sys._current_frames`, torch's) is that library's promise, not ours. Names are bound
    per module, not per scope: a local that shadows an imported module could be misread."""
    modules = _modules(package)
    found: set[PrivateUse] = set()
    for module, path in modules.items():
        tree = _parse(path)
        bound: dict[str, str] = {}  # local name -> the module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bound[top] = top
            elif isinstance(node, ast.ImportFrom):
                source = _import_source(node, module, path)
                if source not in modules:
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if _is_private(alias.name):
                        found.add(PrivateUse(module, full))
                    elif full in modules:
                        bound[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
                continue
            chain = _dotted(node.value)
            if chain is None or chain[0] not in bound:
                continue
            target = ".".join([bound[chain[0]], *chain[1:]])
            if target in modules and target != module:
                found.add(PrivateUse(module, f"{target}.{node.attr}"))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, wherever the import stands (in a
    function too: a lazy import closes a circle as surely, only later), except under
    `if TYPE_CHECKING:`, which never runs. An import names the most precise module it
    reads: `from a.b import c` is a.b.c when that is a module, else a.b; `import a.b.c` is
    a.b.c. The packages Python initialises on the way (a, a.b) are not edges."""
    modules = _modules(package)
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        tree = _parse(path)
        unchecked = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and _is_type_checking(node.test)
            for statement in node.body
            for inner in ast.walk(statement)
        }
        for node in ast.walk(tree):
            if id(node) in unchecked:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _import_source(node, module, path)
                targets = [
                    f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                    for a in node.names
                ]
            else:
                continue
            graph[module].update(t for t in targets if t in modules and t != module)
    return graph


def _part_of(module: str) -> str:
    """pkg.gateway.stages.outbox -> pkg.gateway; pkg.cli -> pkg.cli."""
    return ".".join(module.split(".")[:2])


def _circles_in_parts(package: Path) -> set[frozenset[str]]:
    """The import circles among the modules of each part (the strongly connected parts of
    the module graph, its edges within a part): each as the set of its modules."""
    graph = {
        module: {t for t in targets if _part_of(t) == _part_of(module)}
        for module, targets in _module_graph(package).items()
    }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: set[frozenset[str]] = set()

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in order:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                circles.add(frozenset(component))

    for node in sorted(graph):
        if node not in order:
            connect(node)
    return circles


def _long_modules_unexplained(package: Path) -> list[str]:
    """Modules over LONG_MODULE lines whose module docstring has no line starting with
    ONE_PIECE (the reason follows it)."""
    found: list[str] = []
    for module, path in _modules(package).items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines <= LONG_MODULE:
            continue
        doc = ast.get_docstring(_parse(path)) or ""
        if not any(line.strip().startswith(ONE_PIECE) for line in doc.splitlines()):
            found.append(f"{module} ({lines} lines)")
    return found


def _says_one_piece(doc: str | None) -> bool:
    return any(line.strip().startswith(ONE_PIECE) for line in (doc or "").splitlines())


def _long_functions_unexplained(package: Path) -> list[str]:
    """Functions and methods over LONG_FUNCTION lines (from `def` to their last line) whose
    docstring has no line starting with ONE_PIECE: split into named steps, or say why not."""
    found: list[tuple[str, int, str]] = []
    for module, path in _modules(package).items():
        for node in ast.walk(_parse(path)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > LONG_FUNCTION and not _says_one_piece(ast.get_docstring(node)):
                found.append((module, node.lineno, f"{node.name} ({lines} lines)"))
    return [f"{module}:{line} {what}" for module, line, what in sorted(found)]


def test_no_module_uses_another_modules_private_names() -> None:
    found = _private_uses(PACKAGE)
    wrong = sorted(found)
    assert not wrong, "private names used across modules: " + "; ".join(map(str, wrong))


def test_no_import_circle_inside_a_part() -> None:
    circles = sorted(sorted(circle) for circle in _circles_in_parts(PACKAGE))
    assert not circles, f"import circles inside a part: {circles}"


def test_a_module_over_600_lines_says_why_it_is_one_piece() -> None:
    found = _long_modules_unexplained(PACKAGE)
    assert not found, f"over {LONG_MODULE} lines, no '{ONE_PIECE}' in the docstring: {found}"


def test_a_function_over_80_lines_says_why_it_is_one_piece() -> None:
    found = _long_functions_unexplained(PACKAGE)
    assert not found, f"over {LONG_FUNCTION} lines, no '{ONE_PIECE}' in the docstring: {found}"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_private_name_rule_finds_each_way_of_taking_one(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/x.py": "_hidden = 1\nshown = 2\n",
            "a/y.py": "from pkg.a.x import _hidden, shown\n",  # planted: from-import
            "a/z.py": "from . import x\n\ndef f():\n    return x._hidden\n",  # planted: attribute
            "b/__init__.py": "",
            "b/w.py": "import pkg.a.x\nv = pkg.a.x._hidden\n",  # planted: a dotted import
            "b/ok.py": "import sys\nfrom pkg.a.x import shown\n_own = sys._getframe\n"
            "def f(self):\n    return self._own, shown.__class__\n",
        },
    )
    assert sorted(map(str, _private_uses(package))) == [
        "pkg.a.y uses pkg.a.x._hidden",
        "pkg.a.z uses pkg.a.x._hidden",
        "pkg.b.w uses pkg.a.x._hidden",
    ]
    (package / "a" / "z.py").write_text("from .x import _hidden as h\n")  # relative, renamed
    (package / "a" / "y.py").write_text("from pkg.a.x import shown\n")
    (package / "b" / "w.py").write_text("import pkg.a.x as alias\nv = alias._hidden\n")
    assert sorted(map(str, _private_uses(package))) == [
        "pkg.a.z uses pkg.a.x._hidden",
        "pkg.b.w uses pkg.a.x._hidden",
    ]


def test_the_circle_rule_finds_a_lazy_circle_and_skips_type_checking(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/x.py": "from pkg.a.y import f\n",
            "a/y.py": "def f():\n    from pkg.a import x\n    return x\n",  # planted: lazy
            "a/p.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.a.q import T\nelse:\n    pass\n",
            "a/q.py": "from pkg.a.p import TYPE_CHECKING\nT = int\n",  # typing only: no circle
            "a/r.py": "import pkg.b.u\n",
            "b/__init__.py": "",
            "b/u.py": "from pkg.a import r\n",  # a circle between parts, not inside one
            "c.py": "import pkg.b.u\n",
        },
    )
    assert _circles_in_parts(package) == {frozenset({"pkg.a.x", "pkg.a.y"})}
    (package / "a" / "p.py").write_text("from pkg.a.q import T\n")  # outside TYPE_CHECKING
    assert _circles_in_parts(package) == {
        frozenset({"pkg.a.x", "pkg.a.y"}),
        frozenset({"pkg.a.p", "pkg.a.q"}),
    }


def test_the_long_module_rule_wants_the_reason_in_the_docstring(tmp_path: Path) -> None:
    body = "x = 1\n" * LONG_MODULE
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "short.py": '"""Short."""\n' + "x = 1\n" * (LONG_MODULE - 1),
            "long.py": '"""Long, and it does not say why."""\n' + body,  # planted
            "told.py": f'"""Long.\n\n{ONE_PIECE} one parser of one format.\n"""\n' + body,
            "comment.py": f"# {ONE_PIECE} in a comment does not count\n" + body,  # planted
        },
    )
    assert _long_modules_unexplained(package) == [
        f"pkg.comment ({LONG_MODULE + 1} lines)",
        f"pkg.long ({LONG_MODULE + 1} lines)",
    ]


def test_the_long_function_rule_wants_the_reason_in_the_docstring(tmp_path: Path) -> None:
    body = "    x = 1\n" * (LONG_FUNCTION - 2)  # with `def` and the docstring: LONG_FUNCTION
    told = f'    """Long.\n\n    {ONE_PIECE} one state machine.\n    """\n'
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "m.py": 'def fits():\n    """Short."""\n'
            + body
            + 'def long():\n    """Says nothing."""\n'
            + body
            + "    x = 2\n"  # planted
            + "class C:\n    async def method(self):\n        pass\n"
            + body.replace("    ", "        ")
            + "        x = 2\n"  # planted: a method
            + "def told():\n"
            + told
            + body,
        },
    )
    assert _long_functions_unexplained(package) == [
        f"pkg.m:{LONG_FUNCTION + 1} long ({LONG_FUNCTION + 1} lines)",
        f"pkg.m:{2 * LONG_FUNCTION + 3} method ({LONG_FUNCTION + 1} lines)",
    ]
