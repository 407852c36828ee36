"""Real parts for the job system's tests: private redis-server processes and real
`celery worker` / pump subprocesses. Only the PIDs started here are ever signalled."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI") == "true"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class RedisServer:
    """A redis-server of our own on a free port, with its own data directory."""

    workdir: Path
    appendonly: bool = False
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (.ci/run installs it)"
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "",
        ]
        command += ["--appendonly", "yes" if self.appendonly else "no"]
        self.process = subprocess.Popen(
            command, stdout=(self.workdir / "redis.log").open("ab"), stderr=subprocess.STDOUT
        )
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 10, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def redis_blob(client: redis.Redis) -> bytes:
    """Every key and value in the database (strings, hashes, lists, sets, zsets) as one blob."""
    blob: list[Any] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        blob.append(key)
        if kind == b"string":
            blob.append(client.get(key) or b"")
        elif kind == b"hash":
            for name, value in client.hgetall(key).items():
                blob += [name, value]
        elif kind == b"list":
            blob += client.lrange(key, 0, -1)
        elif kind == b"set":
            blob += list(client.smembers(key))
        elif kind == b"zset":
            blob += client.zrange(key, 0, -1)
    return b"\n".join(b if isinstance(b, bytes) else str(b).encode() for b in blob)


def job_env(redis_url: str, **overrides: str) -> dict[str, str]:
    """The environment every process of one test shares: fast timings, test agents."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTJOBS_", "CELERY_"))}
    env.update(
        {
            "REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
            "AGENTJOBS_BACKOFF_BASE_S": "0.2",
            "AGENTJOBS_BACKOFF_MAX_S": "5",
            "AGENTJOBS_LEASE_TTL_S": "3",
            "AGENTJOBS_PUMP_INTERVAL_S": "0.1",
            "AGENTJOBS_STALL_AFTER_S": "3",
            "AGENTJOBS_AGENTS": ",".join(
                [
                    "demo=tasks.demo_agents:build_demo_agent",
                    "billing=tests.tasks.agents:build_billing_agent",
                    "support=tests.tasks.agents:build_support_agent",
                    "crasher=tests.tasks.agents:build_crasher_agent",
                    "leaky=tests.tasks.agents:build_leaky_agent",
                    "broken=tests.tasks.agents:build_nothing",
                ]
            ),
        }
    )
    env.update(overrides)
    return env


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)
            self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        # A prefork pool's children belong to this worker too; none must outlive the test.
        for child in children_of(self.popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    if not path.exists():
        return []
    return [int(p) for p in path.read_text().split()]


def start_worker(
    env: Mapping[str, str],
    logdir: Path,
    *,
    name: str = "w1",
    pool: str = "threads",
    concurrency: int = 8,
    extra_args: list[str] | None = None,
    command_prefix: list[str] | None = None,
) -> Process:
    logdir.mkdir(parents=True, exist_ok=True)
    log_path = logdir / f"worker-{name}-{time.monotonic_ns()}.log"
    turns = env.get("AGENTJOBS_TURN_QUEUE", "agentjobs.turns")
    queues = f"{turns},{env.get('AGENTJOBS_RETRY_QUEUE', 'agentjobs.retry')}"
    command = [
        *(command_prefix or []),
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks",
        "worker",
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--queues",
        queues,
        "--hostname",
        f"{name}@%h",
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
        *(extra_args or []),
    ]
    popen = subprocess.Popen(
        command, env=dict(env), cwd=ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT
    )
    process = Process(name, popen, log_path)
    wait_until(
        lambda: "ready." in process.log() or not process.alive(), 60, f"worker {name} to start"
    )
    assert process.alive(), f"worker {name} died at start:\n{process.log()[-3000:]}"
    return process


def start_pump(
    env: Mapping[str, str], logdir: Path, *, command_prefix: list[str] | None = None
) -> Process:
    logdir.mkdir(parents=True, exist_ok=True)
    log_path = logdir / f"pump-{time.monotonic_ns()}.log"
    popen = subprocess.Popen(
        [*(command_prefix or []), sys.executable, "-m", "tasks.pump"],
        env=dict(env),
        cwd=ROOT,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    process = Process("pump", popen, log_path)
    wait_until(lambda: "pump started" in process.log() or not process.alive(), 30, "the pump")
    assert process.alive(), process.log()
    return process


def faketime_prefix(offset_s: float) -> list[str] | None:
    """A command prefix that runs a Python process with its wall clock `offset_s` seconds off,
    through libfaketime (the `faketime` package; .ci/run installs it), or None without it.

    `env LD_PRELOAD=...` rather than the `faketime` command, which forks and does not pass
    signals on: the process the test kills must be the skewed one. The monotonic clock stays
    true (skew is about wall time, and Python's timed waits hang under a faked one); the
    sitecustomize in faketime_shim/ puts back the time.sleep that libfaketime 0.9.10 breaks then.
    """
    libraries = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libraries:
        return None
    shim = ROOT / "tests" / "tasks" / "faketime_shim"
    return [
        "env",
        f"LD_PRELOAD={libraries[0]}",
        f"FAKETIME={offset_s:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
        f"PYTHONPATH={shim}{os.pathsep}{ROOT}",
    ]
