"""README.md's "Use it", as a new user runs it: the factory module written where the README
says, the worker and pump commands run as written in that directory (no PYTHONPATH), and the
client code executed as written. As written the agent answers with EchoProvider, so no key and
no model server are involved; the "with a real model" lines are run too, against a real
OpenAI-compatible server."""

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
REAL_MODEL = "# With a real model, these two lines instead"


def code_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    use_it = text.split("## Use it", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", use_it, re.S)


def block_starting(language: str, first_line: str) -> str:
    found = [b for b in code_blocks(language) if b.startswith(first_line)]
    assert len(found) == 1, f"README's Use it has no single {language} block {first_line!r}"
    return found[0]


def with_the_real_model(factory: str) -> str:
    """The factory module with the two commented lines after REAL_MODEL uncommented."""
    lines = factory.splitlines(keepends=True)
    (at,) = [i for i, line in enumerate(lines) if line.startswith(REAL_MODEL)]
    for i in (at + 1, at + 2):
        assert lines[i].startswith("# "), f"README's real-model line is not commented: {lines[i]!r}"
        lines[i] = lines[i][2:]
    return "".join(lines)


def run_use_it(jobs: Any, tmp_path: Path, factory: str, env: dict[str, str]) -> dict[str, Any]:
    """Write `factory` as myapp/agents.py, run the README's shell lines in tmp_path with `env`
    (plus PATH and HOME), then the client block; returns the client block's namespace."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "agents.py").write_text(factory)
    # The shell lines, pointed at this test's Redis
    shell = next(b for b in code_blocks("sh") if "celery -A tasks worker" in b)
    assert README_REDIS_URL in shell
    script = shell.replace(README_REDIS_URL, jobs.env["REDIS_URL"]) + "wait\n"
    full_env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    started: Process = start_process(
        "use-it", script, {**full_env, **env}, jobs.logdir, ready=READY["worker"], cwd=tmp_path
    )
    jobs.processes.append(started)
    wait_until(lambda: READY["pump"] in started.log(), 30, "the pump")
    client = block_starting("python", "from tasks import")
    namespace: dict[str, Any] = {}
    exec(compile(client, "README.md", "exec"), namespace)
    return namespace


def test_use_it_runs_as_written_without_a_key(make_jobs: Any, tmp_path: Path) -> None:
    # Given the factory module the README shows, as written (EchoProvider), and no key at all
    factory = block_starting("python", "# myapp/agents.py")
    assert "provider = EchoProvider()" in factory
    # When its commands and its client code run as written
    namespace = run_use_it(make_jobs(), tmp_path, factory, {})
    # Then the turn ran on the README's agent, which echoed the message, as the README says
    reply = namespace["reply"]
    assert reply["content"] == "echo: Book a table for two."
    assert '"content": "echo: Book a table for two."' in block_starting(
        "python", "from tasks import"
    )
    assert (reply["conversationId"], reply["turnNumber"], reply["attempts"]) == ("c-42", 1, 1)
    conversation = namespace["conversation"]
    assert conversation is not None
    assert [m["role"] for m in conversation.history] == ["user", "assistant"]
    assert conversation.history[1]["content"] == "echo: Book a table for two."


def test_use_it_with_a_real_model_calls_it(make_jobs: Any, tmp_path: Path) -> None:
    # Given the factory module with the README's "with a real model" lines in place
    factory = with_the_real_model(block_starting("python", "# myapp/agents.py"))
    with model_server(answer="A table for two is booked.") as server:
        env = {
            "OPENAI_API_KEY": "sk-test-readme-0123456789",
            "OPENAI_BASE_URL": f"{server.origin}/v1",
        }
        # When its commands and its client code run as written
        namespace = run_use_it(make_jobs(), tmp_path, factory, env)
    # Then the model server answered the turn
    assert namespace["reply"]["content"] == "A table for two is booked."
    assert len(namespace["conversation"].history) == 2
    (received,) = server.received
    assert received.body["model"] == "gpt-4o-mini"
    assert received.headers["authorization"] == "Bearer sk-test-readme-0123456789"
