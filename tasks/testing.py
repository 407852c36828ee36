"""Real parts for running the job system in tests, benchmarks and the demo (as
celery.contrib.testing does for Celery): a private redis-server, real `celery worker` and pump
subprocesses, and the environment they share. Only the processes started here are signalled.

    server = RedisServer(workdir).start()
    env = job_env(server.url, {"support": "myapp.agents:build_support"})
    worker = start_worker(env, workdir / "logs")
    pump = start_pump(env, workdir / "logs")
    ...
    pump.stop(); worker.stop(); server.stop()
"""

from __future__ import annotations

import contextlib
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

# The source tree: where the Procfile is, and the working directory of the processes started
# here unless told otherwise (agent factories import from a worker's working directory).
ROOT = Path(__file__).resolve().parents[1]
# What each Procfile process logs once it is ready.
READY = {"worker": "ready.", "pump": "pump started", "metrics": "serving metrics on"}


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


def redis_answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


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

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server; "
                "macOS: brew install redis)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            binary,
            *("--port", str(self.port), "--bind", "127.0.0.1"),
            *("--dir", str(self.workdir), "--save", ""),
            *("--appendonly", "yes" if self.appendonly else "no"),
        ]
        self.process = subprocess.Popen(
            command, stdout=(self.workdir / "redis.log").open("ab"), stderr=subprocess.STDOUT
        )
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: redis_answers(client), 10, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


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


def job_env(
    redis_url: str, agents: Mapping[str, str] | None = None, **overrides: str
) -> dict[str, str]:
    """The environment of a private job system's processes: this one's, without its
    AGENTJOBS_* and CELERY_* settings, pointed at `redis_url`, with `agents` registered
    ({name: "module:factory"}) and the source tree importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTJOBS_", "CELERY_"))}
    env["REDIS_URL"] = redis_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # The processes started here must find this interpreter's `celery` and `agentjobs`.
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    if agents:
        env["AGENTJOBS_AGENTS"] = ",".join(f"{name}={target}" for name, target in agents.items())
    env.update(overrides)
    return env


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    # Started in a session of its own (a shell line): signals go to its whole process group.
    group: bool = False

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
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait()
        # A prefork pool's children belong to this worker too; none must outlive it.
        for child in children_of(self.popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.popen.pid, sig)
            else:
                os.kill(self.popen.pid, sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    if not path.exists():
        return []
    return [int(p) for p in path.read_text().split()]


def start_process(
    name: str,
    command: list[str] | str,
    env: Mapping[str, str],
    logdir: Path,
    *,
    ready: str,
    cwd: Path = ROOT,
    timeout_s: float = 60,
    log_stem: str | None = None,
) -> Process:
    """Start `command` (a string runs in a shell, in a session of its own) and wait until its
    log shows `ready`."""
    logdir.mkdir(parents=True, exist_ok=True)
    log_path = logdir / f"{log_stem or name}-{time.monotonic_ns()}.log"
    shell = isinstance(command, str)
    popen = subprocess.Popen(
        command,
        shell=shell,
        env=dict(env),
        cwd=cwd,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=shell,
    )
    process = Process(name, popen, log_path, group=shell)
    wait_until(lambda: ready in process.log() or not process.alive(), timeout_s, f"{name} start")
    if not process.alive():
        raise RuntimeError(f"{name} died at start:\n{process.log()[-3000:]}")
    return process


def start_worker(
    env: Mapping[str, str],
    logdir: Path,
    *,
    name: str = "w1",
    pool: str = "threads",
    concurrency: int = 8,
    app: str = "tasks",
    mingle: bool = False,
    extra_args: list[str] | None = None,
    cwd: Path = ROOT,
    command_prefix: list[str] | None = None,
) -> Process:
    """A `celery -A tasks worker` (of both queues, as the Procfile's) named `name@host`.
    Without mingle and gossip by default: they cost a second at start and nothing here.
    `command_prefix` runs it under another command (`env VAR=...`, a skewed clock)."""
    command = [
        *(command_prefix or []),
        sys.executable,
        *("-m", "celery", "-A", app, "worker"),
        *("--pool", pool, "--concurrency", str(concurrency)),
        *("--hostname", f"{name}@%h", "--loglevel", "INFO"),
        *([] if mingle else ["--without-mingle", "--without-gossip"]),
        *(extra_args or []),
    ]
    return start_process(
        name, command, env, logdir, ready=READY["worker"], cwd=cwd, log_stem=f"worker-{name}"
    )


def start_pump(
    env: Mapping[str, str],
    logdir: Path,
    *,
    cwd: Path = ROOT,
    command_prefix: list[str] | None = None,
) -> Process:
    command = [*(command_prefix or []), sys.executable, "-m", "tasks.pump"]
    return start_process("pump", command, env, logdir, ready=READY["pump"], timeout_s=30, cwd=cwd)


def procfile_commands(path: Path = ROOT / "Procfile") -> dict[str, str]:
    """The Procfile's processes: {name: shell command}."""
    commands = {}
    for line in path.read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not name.lstrip().startswith("#"):
            commands[name.strip()] = command.strip()
    return commands
