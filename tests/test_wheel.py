"""The built wheel holds what an installed agentjobs needs and nothing of the source tree: every
module and Lua script of agent/ and tasks/, no tests or benchmarks, and no code that looks for
files beside the package (a Procfile, a repository root) instead of inside it.

The wheel is built from a copy of the tree (the tree is shared: a build writes build/ and
*.egg-info into the directory it builds), without build isolation, so with this venv's
setuptools and no download.

And the installed wheel runs a turn: pip installs it into a fresh venv (its dependencies from
the package index), and that venv's `celery -A tasks worker` and `agentjobs pump`, started in
a directory holding only the user's agent module, answer a turn submitted by that venv's
Python. Nothing of the source tree is on their path."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tasks.testing import PROCFILE, READY, Process, RedisServer, start_process
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


# The user's agent module, as someone who installed the wheel writes it: an agent whose model
# is a provider class of its own (agent.LLMProvider's shape), answering every request. Its
# answer names the `tasks` package the worker imported, so the test sees which one ran.
AGENT_MODULE = """\
import os

import tasks
from agent import Agent, LLMRequest, LLMResponse


class EchoModel:
    name = "echo"

    def complete(self, request: LLMRequest) -> LLMResponse:
        said = [m["content"] for m in request.messages if m.get("role") == "user"]
        return LLMResponse(content=f"echo: {said[-1]} | {os.path.dirname(tasks.__file__)}")


def build() -> Agent:
    return Agent(provider=EchoModel(), model="echo-1", id="echo")
"""

# What the user's client runs: submit a turn, wait for it, read the conversation back.
CLIENT = """\
import json
import sys

import agent
import tasks
from tasks import load_conversation, run_turn

reply = run_turn.delay(agent="echo", conversation_id="c-wheel", message="hello").get(timeout=60)
stored = load_conversation("c-wheel")
print(json.dumps({
    "tasks": tasks.__file__,
    "agent": agent.__file__,
    "path": sys.path,
    "reply": reply,
    "history": [m["role"] for m in stored.history] if stored else None,
}))
"""


def installed_env(venv: Path, redis_url: str) -> dict[str, str]:
    """The environment of the installed deployment: the fresh venv's commands first on PATH and
    the test run's venv off it, no PYTHONPATH, none of this process's agentjobs or Celery
    settings."""
    ours = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENTJOBS_", "CELERY_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p and p != ours]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["VIRTUAL_ENV"] = str(venv)
    env["REDIS_URL"] = redis_url
    env["AGENTJOBS_AGENTS"] = "echo=myagents:build"
    return env


@pytest.mark.integration
def test_the_installed_wheel_runs_a_turn(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    assert wheel.filename is not None
    assert not tmp_path.resolve().is_relative_to(ROOT), "the venv must be outside the tree"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # The dependencies come from the package index (pip's cache helps a second run).
    install = [python, "-m", "pip", "install", "--quiet", wheel.filename]
    done = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"pip install of the wheel failed:\n{done.stdout}{done.stderr}"

    app_dir = tmp_path / "app"  # holds the user's agent module and nothing else
    app_dir.mkdir()
    (app_dir / "myagents.py").write_text(AGENT_MODULE)
    server = RedisServer(tmp_path / "redis").start()
    env = installed_env(venv, server.url)
    logs = tmp_path / "logs"
    started: list[Process] = []
    try:
        for name in ("worker", "pump"):  # the Procfile's lines, as a deployment runs them
            started.append(
                start_process(name, PROCFILE[name], env, logs, ready=READY[name], cwd=app_dir)
            )
        client = subprocess.run(
            [python, "-c", CLIENT], cwd=app_dir, env=env, capture_output=True, text=True, timeout=90
        )
        assert client.returncode == 0, client.stdout + client.stderr
        seen = json.loads(client.stdout.strip().splitlines()[-1])
        assert all(process.alive() for process in started)
    except BaseException:
        for process in started:
            print(f"--- {process.name} log ---\n{process.log()[-3000:]}")
        raise
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.stop()
        server.stop()

    installed = (venv / "lib").resolve()
    # The client, and the worker that answered, imported the installed packages.
    assert Path(seen["tasks"]).resolve().is_relative_to(installed), seen["tasks"]
    assert Path(seen["agent"]).resolve().is_relative_to(installed), seen["agent"]
    content, worker_tasks = seen["reply"]["content"].split(" | ")
    assert content == "echo: hello"
    assert Path(worker_tasks).resolve().is_relative_to(installed), worker_tasks
    assert not [p for p in seen["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert seen["reply"]["turnNumber"] == 1 and seen["reply"]["attempts"] == 1
    assert seen["history"] == ["user", "assistant"]
    # The deployment needed nothing in its directory but the agent module.
    assert {p.name for p in app_dir.iterdir()} <= {"myagents.py", "__pycache__"}
