"""Real parts for running the job system in tests, benchmarks and the demo (as
celery.contrib.testing does for Celery): a private redis-server, real `celery worker` and pump
subprocesses, and the environment they share. Only the processes started here are signalled.
Nothing here needs the source tree: the processes run in the caller's working directory (or the
one passed in), and the Procfile's commands are written below (PROCFILE).

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
import random
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

# The port the Procfile's metrics exporter listens on (`agentjobs metrics`' default), and the
# console's (`agentjobs web`'s default).
METRICS_PORT = 9808
WEB_PORT = 8088
# The deployment's processes, {name: shell command}: the Procfile's lines, here so the demo and
# the tests run them from an installed package too (tests/tasks/test_procfile.py checks that
# the Procfile says the same).
PROCFILE = {
    "worker": "celery -A tasks worker --pool threads --loglevel INFO",
    "pump": "agentjobs pump",
    "metrics": f"agentjobs metrics --port {METRICS_PORT}",
    "web": "agentjobs web",
}
# What each of them logs once it is ready.
READY = {
    "worker": "ready.",
    "pump": "pump started",
    "metrics": "serving metrics on",
    "web": "Uvicorn running on",
}


def procfile(*, metrics_port: int = METRICS_PORT, web_port: int = WEB_PORT) -> dict[str, str]:
    """PROCFILE with its metrics exporter on `metrics_port` and the console on `web_port`."""
    web = PROCFILE["web"] + (f" --port {web_port}" if web_port != WEB_PORT else "")
    return {**PROCFILE, "metrics": f"agentjobs metrics --port {metrics_port}", "web": web}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now, binding as Python's HTTP servers do
    (SO_REUSEADDR: a port held only by closed connections counts as free)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A free port for a cluster node: its bus listens 10000 above it, so both must be free and
    the port at most 55535."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20000, 55535)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


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
    # More redis-server options: cluster mode, a replica's --replicaof.
    extra_args: list[str] = field(default_factory=list)

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
            *self.extra_args,
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

    def kill(self) -> None:
        """SIGKILL: the server dies with whatever it had not written or replicated."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
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
    ({name: "module:factory"}). This process's working directory goes first on PYTHONPATH, so
    agent modules there import in every process started with this environment, wherever it
    runs and the pump too, as `celery -A` imports from a worker's working directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTJOBS_", "CELERY_"))}
    env["REDIS_URL"] = redis_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
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
    terminated: bool = False  # SIGTERM sent (terminate): stop() only waits

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)
            self.popen.wait(timeout=30)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting; stop() waits."""
        if self.alive() and not self.terminated:
            self._signal(signal.SIGTERM)
            self.terminated = True

    def stop(self) -> None:
        if self.alive():
            self.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait()
        # A prefork pool's children belong to this worker too; none must outlive it.
        for child in children_of(self.popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        if self.group:
            self._wait_for_group()

    def _wait_for_group(self, timeout_s: float = 15) -> None:
        """A shell line's leader may exit before the command it started (a worker still in its
        warm shutdown): wait for the whole group, then kill what is left of it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.popen.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)

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
    cwd: Path | None = None,
    timeout_s: float = 60,
    log_stem: str | None = None,
) -> Process:
    """Start `command` (a string runs in a shell, in a session of its own) in `cwd` (default:
    this process's working directory) and wait until its log shows `ready`."""
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
    cwd: Path | None = None,
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
    cwd: Path | None = None,
    command_prefix: list[str] | None = None,
) -> Process:
    command = [*(command_prefix or []), sys.executable, "-m", "tasks.turn.pump"]
    return start_process("pump", command, env, logdir, ready=READY["pump"], timeout_s=30, cwd=cwd)


def procfile_commands(path: Path) -> dict[str, str]:
    """The processes of the Procfile at `path`: {name: shell command}."""
    commands = {}
    for line in path.read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not name.lstrip().startswith("#"):
            commands[name.strip()] = command.strip()
    return commands


@dataclass
class RedisClusterServers:
    """A Redis Cluster of our own: `masters` redis-servers in cluster mode on free ports, each
    with its own directory, joined with `redis-cli --cluster create` (no replicas)."""

    workdir: Path
    masters: int = 3
    servers: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The AGENTJOBS_STATE_URL of this cluster (every node as a seed)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self) -> RedisClusterServers:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (it comes with redis-server)")
        for n in range(self.masters):
            server = RedisServer(self.workdir / f"node{n}", port=free_cluster_port())
            server.extra_args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            self.servers.append(server.start())
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        probe = redis.Redis(port=self.servers[0].port)
        wait_until(
            lambda: probe.cluster("info").get("cluster_state") == "ok", 30, "the cluster to form"
        )
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@dataclass
class SentinelGroup:
    """A master, a replica and three sentinels of our own (redis-server --sentinel), quorum 2,
    on free ports; `failover_ms` is how long the sentinels wait before calling the master down."""

    workdir: Path
    master_name: str = "agentjobs"
    down_after_ms: int = 1000
    master: RedisServer | None = None
    replica: RedisServer | None = None
    sentinels: list[Process] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def start(self) -> SentinelGroup:
        self.master = RedisServer(self.workdir / "master").start()
        self.replica = RedisServer(self.workdir / "replica")
        self.replica.extra_args = ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica.start()
        binary = shutil.which("redis-server")
        assert binary is not None
        for n in range(3):
            port = free_port()
            conf = self.workdir / f"sentinel{n}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master_name} 10000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
            )
            process = start_process(
                f"sentinel{n}",
                [binary, str(conf), "--sentinel"],
                os.environ,
                self.workdir / "logs",
                ready="+monitor master",
                timeout_s=20,
            )
            self.sentinels.append(process)
            self.sentinel_ports.append(port)
        wait_until(lambda: self._sentinels_see_replica(), 30, "the sentinels to see the replica")
        return self

    def _sentinels_see_replica(self) -> bool:
        for port in self.sentinel_ports:
            try:
                replicas = redis.Redis(port=port).sentinel_slaves(self.master_name)
            except redis.RedisError:
                return False
            if not replicas:
                return False
        return True

    def master_port(self) -> int:
        """The master's port as the first sentinel answers now."""
        host_port: Any = redis.Redis(port=self.sentinel_ports[0]).sentinel_get_master_addr_by_name(
            self.master_name
        )
        return int(host_port[1])

    def stop(self) -> None:
        for process in self.sentinels:
            process.stop()
        for server in (self.master, self.replica):
            if server is not None:
                server.stop()


@dataclass
class RabbitVhost:
    """A RabbitMQ virtual host of our own on the local broker (made with rabbitmqctl, which
    needs the rights of the broker's operator, root on a CI machine), for guest/guest."""

    name: str = field(default_factory=lambda: f"agentjobs-test-{os.getpid()}-{time.time_ns()}")
    host: str = "127.0.0.1"
    port: int = 5672

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/{self.name}"

    @staticmethod
    def problem() -> str:
        """Why no vhost can be made here, or '' when one can."""
        if shutil.which("rabbitmqctl") is None:
            return "rabbitmqctl is not installed (apt-get install rabbitmq-server)"
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex(("127.0.0.1", 5672)) != 0:
                return "no RabbitMQ answers on 127.0.0.1:5672 (rabbitmq-server -detached)"
        return ""

    def create(self) -> RabbitVhost:
        for command in (
            ["add_vhost", self.name],
            ["set_permissions", "-p", self.name, "guest", ".*", ".*", ".*"],
        ):
            subprocess.run(["rabbitmqctl", "-q", *command], check=True, capture_output=True)
        return self

    def delete(self) -> None:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.name], capture_output=True)
