"""The README's ACL user (Security model) is enough: a private Redis whose only user is the one
the README describes runs turns, a retry, the pump and `agentjobs stats` through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tasks.testing import RedisServer, start_pump, start_worker
from tests.tasks.conftest import job_env

# Exactly as the README's "Security model" gives it.
README_ACL = "on >s3cret-pw ~* &* +@all -@dangerous +info"


@pytest.fixture
def acl_redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "agentjobs", *README_ACL.split())
    admin.execute_command("ACL", "SETUSER", "default", "off")
    admin.close()
    yield server
    server.stop()


# The client runs in a process of its own: this one's Celery app has cached its connections to
# the session's Redis.
CLIENT = """
from tasks import run_turn
plain = run_turn.delay(agent="demo", conversation_id="acl-1", message="hi")
retried = run_turn.delay(agent="demo", conversation_id="acl-2", message="x fail:503x1")
print(plain.get(timeout=30)["content"], retried.get(timeout=30)["attempts"])
"""


def test_the_readme_acl_user_runs_the_job_system(acl_redis: RedisServer, tmp_path: Path) -> None:
    url = f"redis://agentjobs:s3cret-pw@127.0.0.1:{acl_redis.port}/0"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(acl_redis.url).ping()  # nobody else gets in
    env = job_env(url)
    processes = [start_worker(env, tmp_path / "logs"), start_pump(env, tmp_path / "logs")]
    try:
        client = subprocess.run(
            [sys.executable, "-c", CLIENT], env=env, capture_output=True, text=True, timeout=90
        )
        assert client.returncode == 0, client.stderr[-3000:]
        assert client.stdout.split() == ["Done:", "hi", "2"]
        stats = subprocess.run(
            [str(Path(sys.executable).parent / "agentjobs"), "stats"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert stats.returncode == 0, stats.stderr
        assert "NOPERM" not in "\n".join(p.log() for p in processes)
    finally:
        for process in processes:
            process.stop()
