"""The Procfile as a deployment runs it: each line as written, with only REDIS_URL and the
agent registry set. Its lines are also in code (tasks.testing.PROCFILE, what the demo runs from
an installed package): the two must say the same."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from tasks import load_conversation, run_turn
from tasks.testing import PROCFILE, READY, Process, procfile_commands, start_process
from tests.conftest import ROOT


def test_the_procfile_says_what_the_code_runs() -> None:
    # Same processes, same order (the demo starts and stops them in it), same command lines.
    assert list(procfile_commands(ROOT / "Procfile").items()) == list(PROCFILE.items()), (
        "the Procfile and tasks.testing.PROCFILE differ: change both"
    )
    assert set(PROCFILE) == set(READY), "a new Procfile process needs a readiness check"


def test_procfile_commands_reads_the_file_it_is_given(tmp_path: Path) -> None:
    procfile = tmp_path / "Procfile"
    procfile.write_text("# a comment: ignored\nweb: gunicorn app:wsgi\n\nworker:  celery -A x\n")
    assert procfile_commands(procfile) == {"web": "gunicorn app:wsgi", "worker": "celery -A x"}


def test_every_procfile_line_runs_with_only_redis_url(make_jobs: Any, tmp_path: Path) -> None:
    jobs = make_jobs()
    commands = procfile_commands(ROOT / "Procfile")
    env = {
        "REDIS_URL": jobs.env["REDIS_URL"],
        "AGENTJOBS_AGENTS": "demo=tasks.demo.agents:build_demo_agent",
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    started: list[Process] = []
    try:
        for name, command in commands.items():
            started.append(
                start_process(name, command, env, tmp_path, ready=READY[name], cwd=tmp_path)
            )
        banner = started[0].log()
        # The worker consumes both queues without -Q, with the default concurrency.
        for queue in ("agentjobs.turns", "agentjobs.retry"):
            assert re.search(rf"\.> {queue}\s+exchange={queue}\(direct\)", banner), banner
        assert "concurrency: 32 (thread)" in banner
        reply = run_turn.delay(agent="demo", conversation_id="proc", message="hi fail:503x1")
        assert reply.get(timeout=30)["attempts"] == 2, (
            "the retry needs the pump and the retry queue"
        )
        assert load_conversation("proc") is not None
    finally:
        for process in started:
            process.stop()
