"""README.md's "Use it", as a new user runs it: the factory module written where the README
says, the worker and pump commands run as written in that directory (no PYTHONPATH), and the
client code executed as written, against a real OpenAI-compatible server."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tasks.testing import READY, Process, start_process, wait_until
from tests.conftest import ROOT
from tests.tasks.model_server import model_server

pytestmark = pytest.mark.integration

README_REDIS_URL = "redis://127.0.0.1:6379/0"


def code_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    use_it = text.split("## Use it", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", use_it, re.S)


def block_starting(language: str, first_line: str) -> str:
    found = [b for b in code_blocks(language) if b.startswith(first_line)]
    assert len(found) == 1, f"README's Use it has no single {language} block {first_line!r}"
    return found[0]


def test_use_it_runs_as_written(make_jobs: Any, tmp_path: Path) -> None:
    jobs = make_jobs()
    # Given the factory module the README shows, saved where its first line says
    factory = block_starting("python", "# myapp/agents.py")
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "agents.py").write_text(factory)
    # and its shell lines, pointed at this test's Redis
    shell = next(b for b in code_blocks("sh") if "celery -A tasks worker" in b)
    assert README_REDIS_URL in shell
    script = shell.replace(README_REDIS_URL, jobs.env["REDIS_URL"]) + "wait\n"
    with model_server(answer="A table for two is booked.") as server:
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "OPENAI_API_KEY": "sk-test-readme-0123456789",
            "OPENAI_BASE_URL": f"{server.origin}/v1",
        }
        # When the commands run in that directory, in one shell
        started: Process = start_process(
            "use-it", script, env, jobs.logdir, ready=READY["worker"], cwd=tmp_path
        )
        jobs.processes.append(started)
        wait_until(lambda: READY["pump"] in started.log(), 30, "the pump")
        # and the client code runs as written
        client = block_starting("python", "from tasks import run_turn")
        namespace: dict[str, Any] = {}
        exec(compile(client, "README.md", "exec"), namespace)
    # Then the turn ran on the README's agent, and its conversation is stored
    assert namespace["reply"]["content"] == "A table for two is booked."
    assert namespace["reply"]["conversationId"] == "c-42"
    assert namespace["conversation"] is not None
    assert len(namespace["conversation"].history) == 2
    (received,) = server.received
    assert received.body["model"] == "gpt-4o-mini"
    assert received.headers["authorization"] == "Bearer sk-test-readme-0123456789"
