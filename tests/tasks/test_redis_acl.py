"""The README's ACL user (Security model) is enough: a private Redis whose only user is the one
the README describes runs turns, a retry, the pump and `agentjobs stats` through it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from tasks import run_turn
from tasks.testing import RedisServer, start_pump, start_worker
from tests.tasks.conftest import configure_client, drop_client_connections, job_env

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


def test_the_readme_acl_user_runs_the_job_system(
    acl_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks import app

    url = f"redis://agentjobs:s3cret-pw@127.0.0.1:{acl_redis.port}/0"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(acl_redis.url).ping()  # nobody else gets in
    env = job_env(url)
    configure_client(env, monkeypatch)
    previous = (app.conf.broker_url, app.conf.result_backend)
    app.conf.update(broker_url=url, result_backend=url)
    drop_client_connections()
    processes = [start_worker(env, tmp_path / "logs"), start_pump(env, tmp_path / "logs")]
    try:
        plain = run_turn.delay(agent="demo", conversation_id="acl-1", message="hi")
        retried = run_turn.delay(agent="demo", conversation_id="acl-2", message="x fail:503x1")
        assert plain.get(timeout=30)["content"] == "Done: hi"
        assert retried.get(timeout=30)["attempts"] == 2
        stats = subprocess.run(
            [str(Path(__import__("sys").executable).parent / "agentjobs"), "stats"],
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
        app.conf.update(broker_url=previous[0], result_backend=previous[1])
        drop_client_connections()
