"""The layout's rules, read from the code: no import circle among the modules of agent/ and
tasks/ (imports inside functions and under TYPE_CHECKING count too), and each subpackage of
tasks/ imports only what its docstring's "May import:" line names, so the arrows run downward.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "tasks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imported(path: Path, name: str, known: dict[str, Path]) -> Iterator[str]:
    """The modules of agent/ and tasks/ that `path` imports, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule when there is one.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(path, name, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_no_import_circle() -> None:
    found = cycles(graph())
    assert found == [], f"import circles: {found}"


def allowed_imports(package: str) -> set[str]:
    """The "May import:" line of a subpackage's docstring, as module prefixes."""
    doc = ast.get_docstring(
        ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    )
    match = re.search(r"^May import:(.*?)(?:\n\n|\Z)", doc or "", re.M | re.S)
    assert match, f"{package}/__init__.py's docstring has no 'May import:' line"
    names = re.findall(r"`?((?:agent|tasks)(?:\.[a-z_]+)*)`?", match.group(1))
    assert names or "nothing" in match.group(1), f"{package}: the 'May import:' line names nothing"
    return set(names)


def permits(allowed: str, target: str) -> bool:
    """`tasks` alone names the public surface (tasks/__init__.py), not everything below it."""
    return target == allowed or (allowed != "tasks" and target.startswith(allowed + "."))


SUBPACKAGES = sorted(module_name(p.parent) for p in (ROOT / "tasks").glob("*/__init__.py"))


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_subpackage_imports_only_what_it_says(package: str) -> None:
    allowed = allowed_imports(package)
    edges = graph()
    wrong = sorted(
        f"{source} -> {target}"
        for source, targets in edges.items()
        if source == package or source.startswith(package + ".")
        for target in targets
        if not target.startswith(package) and not any(permits(a, target) for a in allowed)
    )
    assert wrong == [], f"{package} imports beyond its 'May import:' line: {wrong}"


def test_subpackages_say_what_they_own() -> None:
    for package in SUBPACKAGES:
        doc = ast.get_docstring(
            ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
        )
        assert doc and len(doc.split()) > 20, f"{package} has no docstring saying what it owns"


def test_the_checker_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
