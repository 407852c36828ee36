"""The built wheel holds what an installed agentjobs needs and nothing of the source tree: every
module and Lua script of agent/ and tasks/, no tests or benchmarks, and no code that looks for
files beside the package (a Procfile, a repository root) instead of inside it.

The wheel is built from a copy of the tree (the tree is shared: a build writes build/ and
*.egg-info into the directory it builds), without build isolation, so with this venv's
setuptools and no download."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Not copied for the build: what a checkout has besides its files.
LEFT_OUT = shutil.ignore_patterns(
    *(".git", ".venv", ".hypothesis", ".*_cache", "__pycache__", "*.pyc"),
    *("*.egg-info", "build", "dist", "var"),
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("source")
    for item in ROOT.iterdir():
        if LEFT_OUT(str(ROOT), [item.name]):
            continue
        if item.is_dir():
            shutil.copytree(item, source / item.name, ignore=LEFT_OUT)
        else:
            shutil.copy2(item, source / item.name)
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps"]
    command += ["--no-build-isolation", "--no-cache-dir", "--quiet", "-w", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        "the wheel did not build (the test extra's setuptools>=70.1 makes wheels without "
        f"build isolation; `./dev test` installs it):\n{done.stdout}{done.stderr}"
    )
    (path,) = out.glob("agentjobs-*.whl")
    return zipfile.ZipFile(path)


def tree_files(pattern: str) -> list[str]:
    """The tree's files under agent/ and tasks/ matching `pattern`, as paths in a wheel."""
    return sorted(
        str(path.relative_to(ROOT))
        for top in ("agent", "tasks")
        for path in (ROOT / top).rglob(pattern)
        if "__pycache__" not in path.parts
    )


def test_every_lua_script_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    scripts = tree_files("*.lua")
    assert "tasks/store/lua/claim.lua" in scripts
    for script in scripts:
        assert wheel.read(script) == (ROOT / script).read_bytes(), script


def test_every_module_and_package_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    modules = tree_files("*.py")
    # A directory of modules without an __init__.py is no package to setuptools' find:
    # its modules would be missing below, and this names the cause.
    for module in modules:
        package = Path(module).parent
        assert (package / "__init__.py").as_posix() in modules, f"{package} has no __init__.py"
    missing = [module for module in modules if module not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert "tasks/cli/__main__.py" in names  # `python -m tasks.cli`, the demo's dlq list


def test_the_wheel_holds_the_packages_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert tops - dist_info == {"agent", "tasks", "celeryconfig.py"}
    assert not [name for name in wheel.namelist() if "__pycache__" in name]


def test_the_wheel_declares_its_command_and_the_redis_transport(wheel: zipfile.ZipFile) -> None:
    (dist_info,) = {n.split("/", 1)[0] for n in wheel.namelist() if ".dist-info/" in n}
    metadata = wheel.read(f"{dist_info}/METADATA").decode()
    # kombu's Redis transport imports `packaging`, which kombu's redis extra brings.
    assert "Requires-Dist: kombu[redis]" in metadata
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert "agentjobs = tasks.cli:main" in entry_points


def source_tree_lookups(tree: ast.AST) -> list[str]:
    """What in one module finds files through its own location rather than through
    importlib.resources or a path it is given: `__file__`, `.parents[...]`, a literal
    'Procfile'."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "__file__":
            found.append(f"line {node.lineno}: __file__")
        elif isinstance(node, ast.Attribute) and node.attr == "parents":
            found.append(f"line {node.lineno}: .parents")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.rstrip("/").rsplit("/", 1)[-1] == "Procfile"
        ):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_source_tree_lookups_are_found() -> None:
    sample = 'ROOT = Path(__file__).resolve().parents[1]\nopen(ROOT / "Procfile")\n'
    assert sorted(source_tree_lookups(ast.parse(sample))) == [
        "line 1: .parents",
        "line 1: __file__",
        "line 2: 'Procfile'",
    ]


def test_no_module_in_the_wheel_looks_for_the_source_tree(wheel: zipfile.ZipFile) -> None:
    found = {
        name: lookups
        for name in wheel.namelist()
        if name.endswith(".py")
        and (lookups := source_tree_lookups(ast.parse(wheel.read(name), filename=name)))
    }
    assert not found, f"modules that look beside the package for files: {found}"
