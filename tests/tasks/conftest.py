"""Fixtures for the job system: one private redis-server per session, and per test a clean
database, the test's environment in this process (the client side) and its worker processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tasks import testing
from tasks.testing import Process, RedisServer, start_pump, start_worker

# The agents the test workers load by name (tests/tasks/agents.py, and the demo's).
TEST_AGENTS = {
    "demo": "tasks.demo.agents:build_demo_agent",
    "billing": "tests.tasks.agents:build_billing_agent",
    "support": "tests.tasks.agents:build_support_agent",
    "crasher": "tests.tasks.agents:build_crasher_agent",
    "leaky": "tests.tasks.agents:build_leaky_agent",
    "leaky_tool": "tests.tasks.agents:build_leaky_tool_agent",
    "broken": "tests.tasks.agents:build_nothing",
    "raising": "tests.tasks.agents:build_raising",
    "journal_idempotent": "tests.tasks.agents:build_journal_idempotent",
    "journal_unsafe": "tests.tasks.agents:build_journal_unsafe",
    "journal_parallel_idempotent": "tests.tasks.agents:build_journal_parallel_idempotent",
    "journal_parallel_unsafe": "tests.tasks.agents:build_journal_parallel_unsafe",
    "person": "tests.tasks.agents:build_person_agent",
    "console": "tests.tasks.console_agents:build_console_agent",
    "store_rounds": "tests.tasks.store_agents:build_store_rounds",
}


def job_env(redis_url: str, **overrides: str) -> dict[str, str]:
    """The environment every process of one test shares: fast timings, the test agents."""
    fast = {
        "AGENTJOBS_BACKOFF_BASE_S": "0.2",
        "AGENTJOBS_BACKOFF_MAX_S": "5",
        "AGENTJOBS_LEASE_TTL_S": "3",
        "AGENTJOBS_PUMP_INTERVAL_S": "0.1",
        "AGENTJOBS_STALL_AFTER_S": "3",
    }
    return testing.job_env(redis_url, TEST_AGENTS, **{**fast, **overrides})


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    # appendonly: a test that restarts this server finds its data again, as in production.
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=True).start()
    from tasks import app

    # The client side of every test talks to this server; set before anything connects.
    app.conf.update(broker_url=server.url, result_backend=server.url)
    yield server
    server.stop()


@dataclass
class Jobs:
    """One test's job system: environment, Redis client, and the processes it started."""

    env: dict[str, str]
    redis: redis.Redis
    logdir: Path
    processes: list[Process] = field(default_factory=list)

    def worker(self, env: dict[str, str] | None = None, **options: Any) -> Process:
        process = start_worker({**self.env, **(env or {})}, self.logdir, **options)
        self.processes.append(process)
        return process

    def pump(self, **options: Any) -> Process:
        process = start_pump(self.env, self.logdir, **options)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            process.stop()

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.processes)


def configure_client(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.queue.context import reset

    for key in list(os.environ):
        if key.startswith("AGENTJOBS_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(("AGENTJOBS_", "REDIS_URL")):
            monkeypatch.setenv(key, value)
    reset()


def drop_client_connections() -> None:
    """After a test restarted Redis: this process's pooled broker connections died with it,
    and the next broadcast (app.control.ping) would pick one. Celery resets its pools the same
    way in a forked child."""
    from kombu import pools

    from tasks import app

    pools.reset()  # kombu's process-wide connection and producer pools (app.pool is one)
    app._after_fork()


@pytest.fixture
def make_jobs(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """make_jobs(**env_overrides) -> Jobs, with a flushed database."""
    started: list[Jobs] = []

    def make(**overrides: str) -> Jobs:
        client = redis.Redis.from_url(redis_server.url)
        client.flushdb()
        env = job_env(redis_server.url, **overrides)
        configure_client(env, monkeypatch)
        jobs = Jobs(env=env, redis=client, logdir=tmp_path / "logs")
        started.append(jobs)
        return jobs

    yield make
    for jobs in started:
        jobs.stop_all()
    from tasks.queue.context import reset

    reset()


@pytest.fixture
def jobs(make_jobs: Any) -> Jobs:
    """The common case: default test settings, one threads worker and the pump."""
    running: Jobs = make_jobs()
    running.worker()
    running.pump()
    return running
