"""The Dockerfile and its build context (no Docker engine here: parse them, and build the
wheel the image installs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from chart.chart_helm import REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, args in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, args))
    return result


def test_multi_stage_from_a_pinned_slim_python_311() -> None:
    args = {
        k: v for k, v in (a.split("=", 1) for kw, a in instructions() if kw == "ARG" and "=" in a)
    }
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    froms = [a for kw, a in instructions() if kw == "FROM"]
    assert len(froms) >= 2
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)


def test_runtime_stage_is_non_root_and_runs_trainsentry() -> None:
    runtime = stages()[-1]
    users = [a for kw, a in runtime if kw == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) > 0
    entry = [a for kw, a in runtime if kw == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["trainsentry"]
    copies = [a for kw, a in runtime if kw == "COPY"]
    assert copies and all(c.startswith("--from=build") for c in copies), copies
    # The chart runs the pods as 10001 with a read-only root: the image agrees.
    assert users[-1] == "10001:10001"


def test_installs_the_wheel_and_no_torch() -> None:
    build = " ".join(a for kw, a in stages()[0] if kw == "RUN")
    assert "pip wheel" in build and "--no-index" in build
    assert "torch" not in " ".join(a for kw, a in instructions() if kw == "RUN")
    assert "[probe]" not in build


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: a pattern matching the path or a parent folder applies; the last
    applying pattern wins; `!` re-includes."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            ignored = not negate
    return ignored


def dockerignore_patterns() -> list[str]:
    return [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_dockerignore_keeps_the_sources_and_drops_the_rest() -> None:
    patterns = dockerignore_patterns()
    kept = [
        "pyproject.toml",
        "setup.py",
        "README.md",
        "constraints.txt",
        "trainsentry/cli.py",
        "rules/gpu.yaml",
        "rules/dcgm-counters.csv",
        "dashboards/trainingjob.json",
    ]
    dropped = [
        ".venv/bin/python",
        ".git/HEAD",
        ".cache/bin/helm",
        "tests/chart/test_image.py",
        "trainsentry/__pycache__/cli.cpython-311.pyc",
        "rules/tests/gpu_test.yaml",
        "bench/x.py",
        "charts/trainsentry/Chart.yaml",
        "docs/deploy.md",
    ]
    assert [p for p in kept if _ignored(p, patterns)] == []
    assert [p for p in dropped if not _ignored(p, patterns)] == []


def test_copied_sources_exist_and_are_in_the_build_context() -> None:
    patterns = dockerignore_patterns()
    copied = [
        source
        for kw, args in instructions()
        if kw == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    ]
    assert copied
    for source in copied:
        assert (REPO / source).exists(), source
        assert not _ignored(source.rstrip("/"), patterns), f"{source} is in .dockerignore"


@pytest.mark.timeout(180)
def test_wheel_carries_rules_dashboards_and_the_entry_point(tmp_path: Path) -> None:
    """What the build stage does, on a copy of the build context (the checkout stays clean)."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "tests", "*.db")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name) if src.exists() else (
            src.mkdir(),
            shutil.copy(REPO / name, src / name),
        )
    for name in ("trainsentry", "rules", "dashboards"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("trainsentry-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "trainsentry = trainsentry.cli:main" in whl.read(entry_points).decode()
    for folder in ("rules", "dashboards"):
        for source in sorted((REPO / folder).glob("*.*")):
            assert f"trainsentry/data/{folder}/{source.name}" in names, source.name
    assert not [n for n in names if n.startswith("trainsentry/data/rules/tests/")]
    assert "trainsentry/data/rules/dcgm-counters.csv" in names
    assert "trainsentry/data/rules/alertmanager-inhibit.yaml" in names
    # The start-up hook the webhook's init container copies (`trainsentry probe install`).
    assert "trainsentry/probe/injected/sitecustomize.py" in names
