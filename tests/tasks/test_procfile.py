"""The Procfile as a deployment runs it: each line as written, with only REDIS_URL set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tasks import load_conversation, run_turn
from tests.tasks.harness import ROOT, wait_until

READY = {"worker": "ready.", "pump": "pump started"}


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return {
        name.strip(): command.strip()
        for name, _, command in (line.partition(":") for line in lines if line.strip())
    }


def test_every_procfile_line_runs_with_only_redis_url(make_jobs: Any, tmp_path: Path) -> None:
    jobs = make_jobs()
    commands = procfile()
    assert set(commands) == set(READY), "a new Procfile process needs a readiness check here"
    env = {
        "REDIS_URL": jobs.env["REDIS_URL"],
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            log = tmp_path / f"{name}.log"
            started.append(
                subprocess.Popen(
                    command,
                    shell=True,
                    env=env,
                    cwd=tmp_path,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            wait_until(lambda log=log, name=name: READY[name] in log.read_text(), 60, name)
        reply = run_turn.delay(agent="demo", conversation_id="proc", message="hi fail:503x1")
        assert reply.get(timeout=30)["attempts"] == 2, "the retry needs the pump"
        assert load_conversation("proc") is not None
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            process.wait(timeout=20)
