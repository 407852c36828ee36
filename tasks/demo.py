"""The demo (`agentjobs demo`): the Procfile's processes on Redis, three turns, the dead
letters. One turn succeeds, one fails twice with HTTP 503 and recovers after a visible backoff,
one gets a 401 and is dead-lettered. Stops everything it started."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO_ENV = {
    "AGENTJOBS_KEY_PREFIX": f"agentjobs-demo-{os.getpid()}",
    "AGENTJOBS_TURN_QUEUE": f"agentjobs-demo-{os.getpid()}.turns",
    "AGENTJOBS_RETRY_QUEUE": f"agentjobs-demo-{os.getpid()}.retry",
    "AGENTJOBS_BACKOFF_BASE_S": "1",
    "AGENTJOBS_PUMP_INTERVAL_S": "0.2",
    "AGENTJOBS_WORKER_CONCURRENCY": "8",
}
TURNS = [
    ("ok", "c-ok", "Where is my order A-17? rounds:2 think:0.3"),
    ("flaky", "c-flaky", "Where is my order B-2? rounds:1 think:0.3 fail:503x2"),
    ("denied", "c-auth", "Refund my order C-3. think:0.3 fail:401"),
]


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def start_private_redis(workdir: Path) -> tuple[str, subprocess.Popen[bytes]] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not redis_answers(url):
        time.sleep(0.05)
    return url, process


def procfile_commands() -> dict[str, str]:
    commands = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not name.startswith("#"):
            commands[name.strip()] = command.strip()
    return commands


def start_processes(env: dict[str, str], logdir: Path) -> dict[str, subprocess.Popen[bytes]]:
    processes = {}
    for name, command in procfile_commands().items():
        log = (logdir / f"{name}.log").open("wb")
        processes[name] = subprocess.Popen(
            command,
            shell=True,
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        say(f"started {name} (pid {processes[name].pid}): {command}")
    return processes


def stop_processes(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_worker(app: Any, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.control.ping(timeout=0.5):
            return True
    return False


def follow(turns: dict[str, Any], timeout_s: float = 40) -> None:
    from tasks.cli import describe_state
    from tasks.context import job_context

    records = job_context().records
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        finished = 0
        for label, result in turns.items():
            record = records.get(result.id)
            state = describe_state(record.as_dict()) if record else "submitted"
            if seen.get(label) != state:
                seen[label] = state
                say(f"{label:7} {state}")
            if record and record.state in ("succeeded", "dead_lettered"):
                finished += 1
        if finished == len(turns):
            return
        time.sleep(0.05)


def remove_demo_keys(client: Any, task_ids: list[str]) -> int:
    """Leave a shared Redis as the demo found it: its prefixed keys, queues and results."""
    names = [
        DEMO_ENV["AGENTJOBS_KEY_PREFIX"],
        DEMO_ENV["AGENTJOBS_TURN_QUEUE"],
        DEMO_ENV["AGENTJOBS_RETRY_QUEUE"],
    ]
    keys = [key for name in names for key in client.scan_iter(match=f"*{name}*", count=1000)]
    keys += [f"celery-task-meta-{task_id}" for task_id in task_ids]
    return int(client.delete(*keys)) if keys else 0


def run_demo(redis_url: str, workdir: Path, *, shared: bool) -> int:
    env = {**os.environ, **DEMO_ENV, "REDIS_URL": redis_url}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS_"))})
    from tasks import TurnDeadLettered, app, load_conversation, run_turn
    from tasks.cli import print_dead_letters
    from tasks.context import job_context

    processes = start_processes(env, workdir)
    turns: dict[str, Any] = {}
    try:
        if not wait_for_worker(app):
            say(f"the worker did not start; see {workdir / 'worker.log'}")
            return 1
        say("worker ready; submitting three turns")
        turns = {
            label: run_turn.delay(agent="demo", conversation_id=cid, message=message)
            for label, cid, message in TURNS
        }
        follow(turns)
        for label, result in turns.items():
            try:
                reply = result.get(timeout=30)
                say(f"{label:7} result: {reply['content']!r} after {reply['attempts']} attempt(s)")
            except TurnDeadLettered as exc:
                say(f"{label:7} dead-lettered: {exc.entry_id} ({exc.reason})")
        conversation = load_conversation("c-flaky")
        if conversation is not None:
            say(f"stored conversation c-flaky: {len(conversation.history)} messages")
        say("dead-letter store (agentjobs dlq list):")
        print_dead_letters(job_context().dead_letters.list_entries())
        return 0
    finally:
        stop_processes(processes)
        say("stopped the worker and the pump")
        if shared:
            removed = remove_demo_keys(job_context().redis, [r.id for r in turns.values()])
            say(f"removed the demo's {removed} keys from the shared Redis")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="agentjobs-demo-") as tmp:
        workdir = Path(tmp)
        redis_url = os.environ.get("REDIS_URL")
        private = None
        if redis_url:
            if not redis_answers(redis_url):
                say("REDIS_URL is set but Redis does not answer there")
                return 1
            say("using the Redis at REDIS_URL (demo keys and queues are prefixed)")
        else:
            private = start_private_redis(workdir)
            if private is None:
                say(
                    "no Redis: set REDIS_URL, or install redis-server "
                    "(Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"
                )
                return 1
            redis_url = private[0]
            say(f"started a private redis-server (pid {private[1].pid}) at {redis_url}")
        try:
            return run_demo(redis_url, workdir, shared=private is None)
        finally:
            if private is not None:
                private[1].terminate()
                private[1].wait(timeout=10)
                say("stopped the private redis-server")


if __name__ == "__main__":
    raise SystemExit(main())
