"""The README's first command: `agentjobs demo` (what `./dev demo` runs) against a Redis, as a
new user runs it: every turn's story told, every process it started stopped, nothing left
behind in a shared Redis. It runs outside the source tree, as from an installed package."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import redis

from tasks.testing import RedisServer

pytestmark = pytest.mark.integration


def test_the_demo_tells_four_turns_and_leaves_nothing_behind(
    redis_server: RedisServer, tmp_path: Any
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.set("someone-elses-key", "kept")
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": redis_server.url, "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "Traceback" not in out + done.stderr
    assert "retrying in" in out and "HTTP 503" in out
    assert "flaky   result:" in out and "after 3 attempt(s)" in out
    assert "dead-lettered as dl-" in out and "non_resumable" in out
    # the dead letters as the operator's command prints them, run by the demo
    assert "as `agentjobs dlq list` shows it:" in out
    assert "1 entry." in out and "`agentjobs dlq show ID` shows one" in out
    # the fourth turn pauses for an approval, which the demo gives after a visible wait
    story = [line.split("] ", 1)[-1] for line in out.splitlines() if "refund " in line]
    paused = next(i for i, line in enumerate(story) if "needs a person's approval" in line)
    approved = next(i for i, line in enumerate(story) if "approved by the demo" in line)
    done = next(i for i, line in enumerate(story) if line.startswith("refund  result:"))
    assert paused < approved < done
    assert "stopped the worker, pump, metrics" in out
    # Nothing of the demo's stays in a Redis it shares (kombu's one shared bookkeeping key
    # aside, which every Celery app on that Redis uses); what was there stays
    left = {key for key in client.scan_iter() if not key.startswith(b"_kombu.")}
    assert left == {b"someone-elses-key"}
