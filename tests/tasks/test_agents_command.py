"""The registered agents, seen from a shell and from a worker: `agentjobs agents` lists each with
its factory and whether it builds (errors in one redacted line); a worker logs them at start and
puts the registry it runs with in its configuration (what Flower shows); with
AGENTJOBS_STRICT_AGENTS=1 a worker whose factory fails refuses to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tasks import app, run_turn
from tests.tasks.conftest import TEST_AGENTS
from tests.tasks.test_cli import cli

SECRET = "sk-live-0123456789abcdefghijklmnop"


def build_leaking() -> Any:
    raise RuntimeError(
        f"cannot start:\n  key {SECRET} refused by https://ops:hunter2@models.example/v1"
    )


REGISTRY = {
    "good": "tasks.demo.agents:build_demo_agent",
    "raising": "tests.tasks.agents:build_raising",
    "none": "tests.tasks.agents:build_nothing",
    "gone": "no_such_module_here:build",
    "leaking": "tests.tasks.test_agents_command:build_leaking",
}


def agents_env(registry: dict[str, str]) -> str:
    return ",".join(f"{name}={target}" for name, target in registry.items())


def test_agents_lists_each_factory_and_whether_it_builds(make_jobs: Any) -> None:
    make_jobs(AGENTJOBS_AGENTS=agents_env(REGISTRY))
    listed = {entry["name"]: entry for entry in orjson.loads(cli("agents", "--json"))}
    assert list(listed) == sorted(REGISTRY)
    assert listed["good"] == {
        "name": "good",
        "factory": "tasks.demo.agents:build_demo_agent",
        "builds": True,
        "error": None,
    }
    assert listed["raising"]["error"] == "RuntimeError: the model's settings are missing"
    assert listed["none"]["error"] == (
        "TypeError: the factory returned NoneType, not an agent.Agent"
    )
    assert listed["gone"]["error"] == "ModuleNotFoundError: No module named 'no_such_module_here'"
    # An error is one line, without the secret, the URL or its credentials
    leaked = listed["leaking"]["error"]
    assert leaked.startswith("RuntimeError: cannot start: key ") and "\n" not in leaked
    for secret in (SECRET, "hunter2", "models.example"):
        assert secret not in leaked, leaked
    assert not any(entry["builds"] for name, entry in listed.items() if name != "good")
    # As a table: a row each, and a line counting those that do not build (exit 0 all the same)
    table = cli("agents", env={"COLUMNS": "200"})
    rows = {line.split()[0]: line for line in table.splitlines()[1:-1]}
    assert rows["good"].split()[1:] == ["tasks.demo.agents:build_demo_agent", "yes"]
    assert rows["raising"].endswith("no: RuntimeError: the model's settings are missing")
    assert table.splitlines()[-1].startswith("5 agents, 4 not built: their turns dead-letter")


def test_agents_imports_factories_from_the_working_directory(
    make_jobs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd_agents_for_listing.py").write_text(
        "from tasks.demo.agents import build_demo_agent as build\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    make_jobs(AGENTJOBS_AGENTS="local=cwd_agents_for_listing:build")
    (entry,) = orjson.loads(cli("agents", "--json"))
    assert entry == {
        "name": "local",
        "factory": "cwd_agents_for_listing:build",
        "builds": True,
        "error": None,
    }


def test_agents_with_none_registered_says_how_to_register_them(make_jobs: Any) -> None:
    make_jobs(AGENTJOBS_AGENTS="")
    assert orjson.loads(cli("agents", "--json")) == []
    assert "no agents are registered" in cli("agents")
    assert "AGENTJOBS_AGENTS=name=module:factory" in cli("agents")


def test_a_worker_logs_its_agents_and_shows_them_in_its_configuration(make_jobs: Any) -> None:
    jobs = make_jobs()
    worker = jobs.worker(name="agents-log")
    # One INFO line lists every agent with its factory, and whether it built or why not
    lines = [line for line in worker.log().splitlines() if "INFO/MainProcess] agents: " in line]
    assert len(lines) == 1, worker.log()[-3000:]
    assert "demo=tasks.demo.agents:build_demo_agent (builds)" in lines[0]
    assert (
        "raising=tests.tasks.agents:build_raising (RuntimeError: the model's settings are missing)"
    ) in lines[0]
    assert all(f"{name}={target} (" in lines[0] for name, target in TEST_AGENTS.items())
    # and the failing ones are also logged as unavailable, once each
    assert worker.log().count("agent 'raising' is unavailable") == 1
    # Celery's `inspect conf` (Flower's configuration view) has the registry it runs with:
    # celeryconfig AGENTS ({}) extended by AGENTJOBS_AGENTS
    replies = app.control.inspect(timeout=5).conf()
    (conf,) = [conf for name, conf in (replies or {}).items() if name.startswith("agents-log@")]
    assert conf["AGENTS"] == TEST_AGENTS


def celery_worker(env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "threads"]
    command += ["--loglevel", "INFO", "--without-mingle", "--without-gossip"]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def test_a_strict_worker_whose_factory_fails_refuses_to_start(make_jobs: Any) -> None:
    jobs = make_jobs(
        AGENTJOBS_STRICT_AGENTS="1",
        AGENTJOBS_AGENTS=agents_env({k: REGISTRY[k] for k in ("good", "raising")}),
    )
    finished = celery_worker(jobs.env)
    log = finished.stdout + finished.stderr
    assert finished.returncode != 0, log[-3000:]
    refusals = [line for line in log.splitlines() if "refusing to start" in line]
    assert len(refusals) == 1, log[-3000:]
    assert (
        "agent 'raising' (RuntimeError: the model's settings are missing) does not build"
    ) in refusals[0]
    assert "AGENTJOBS_STRICT_AGENTS" in refusals[0] and "'good'" not in refusals[0]
    for unwanted in ("Traceback", "Unrecoverable", "ready."):
        assert unwanted not in log, log[-3000:]
    # With every factory building, the strict worker starts and runs turns
    good = jobs.worker(
        {"AGENTJOBS_AGENTS": agents_env({"demo": TEST_AGENTS["demo"]})}, name="strict-ok"
    )
    assert "agents: demo=tasks.demo.agents:build_demo_agent (builds)" in good.log()
    reply = run_turn.delay(agent="demo", conversation_id="c-strict", message="hi")
    assert reply.get(timeout=30)["content"] == "Done: hi"
