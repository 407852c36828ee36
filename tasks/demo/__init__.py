"""The demo (`agentjobs demo`): the Procfile's processes on Redis, four turns, the dead
letters. One turn succeeds, one fails twice with HTTP 503 and recovers after a visible backoff,
one gets a 401 and is dead-lettered, one asks for a refund that needs a person's approval: it
pauses, holding no worker, until the demo approves it. Stops everything it started.

Its agent (tasks/demo/agents.py) is registered in the environment the demo gives its own
processes, never in the production registry; its keys, queues and results live under a key
prefix of its own, and on a shared Redis it removes them afterwards, with its entries in the
one key kombu shares between every app on a Redis (`_kombu.binding_deadlines`). The dead
letters are shown by the operator's own command, `agentjobs dlq list`, run as a process of its
own. Runs from an installed package: its processes are tasks.testing.PROCFILE's, in the current
directory, with the metrics exporter moved off port 9808 and the console off 8088 when
something else listens there; the console runs only when the `web` extra is installed, and the
demo prints its address (it opens nothing itself).

May import: tasks (the public surface, as a user's code does), tasks.testing, tasks.providers,
tasks.operate, tasks.queue, tasks.core, agent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from tasks.operate.events import TurnEvent

DEMO_AGENT = "tasks.demo.agents:build_demo_agent"
TURNS = [
    ("ok", "c-ok", "Where is my order A-17? rounds:2 think:0.3"),
    ("flaky", "c-flaky", "Where is my order B-2? rounds:1 think:0.3 fail:503x2"),
    ("denied", "c-auth", "Refund my order C-3. think:0.3 fail:401"),
    ("refund", "c-refund", "Refund my order D-4. refund:D-4 think:0.3"),
]
# How long the demo lets a paused turn wait before it approves it, so the pause is seen.
APPROVE_AFTER_S = 1.5


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# Model provider settings the demo's worker keeps from this environment: with them the demo
# agent talks to a real model (README.md, "Model provider").
PROVIDER_VARIABLES = ("AGENTJOBS_PROVIDER", "AGENTJOBS_MODEL", "AGENTJOBS_PROVIDER_TIMEOUT_S")


def demo_env(redis_url: str) -> dict[str, str]:
    """The environment of the demo's processes: its agent, its key prefix, quick timings."""
    from tasks.testing import job_env

    provider = {k: v for k, v in os.environ.items() if k in PROVIDER_VARIABLES}
    return job_env(
        redis_url,
        {"demo": DEMO_AGENT},
        AGENTJOBS_KEY_PREFIX=f"agentjobs-demo-{os.getpid()}",
        AGENTJOBS_BACKOFF_BASE_S="1",
        AGENTJOBS_PUMP_INTERVAL_S="0.2",
        AGENTJOBS_WORKER_CONCURRENCY="8",
        **provider,
    )


def describe_event(event: TurnEvent) -> str:
    """One line a person reads for one turn event."""
    data = event.data
    if event.type == "turn.started":
        return f"running on {data.get('worker', '?')} (attempt {event.attempt})"
    if event.type == "tool.started":
        return f"calling {data.get('tool')} ({data.get('toolCallId')})"
    if event.type == "iteration.persisted":
        return f"round {event.iteration - 1} persisted"
    if event.type == "retry.scheduled":
        wait_s = (int(data["dueAt"]) - event.at.timestamp() * 1000) / 1000
        return f"failed: {data.get('error')}; retrying in {wait_s:.1f} s"
    if event.type == "turn.paused":
        asks = ", ".join(
            f"{p.get('tool')}({orjson.dumps(p.get('args')).decode()})"
            for p in data.get("pending", [])
        )
        return f"paused: {asks} needs a person's approval; no worker is held"
    if event.type == "action.decided":
        return f"{data.get('decision')}d by {data.get('actor') or 'someone'}"
    if event.type == "turn.succeeded":
        return f"succeeded: {str(data.get('content'))[:60]!r}"
    if event.type == "turn.dead_lettered":
        return f"dead-lettered as {data.get('entryId')} ({data.get('reason')})"
    return event.type.replace("turn.", "")


def follow(turns: dict[str, Any], timeout_s: float = 40) -> None:
    """Print each turn's events as they happen (tasks.iter_events), until all have ended."""
    from tasks.core.schema import TERMINAL_EVENTS
    from tasks.operate.events import iter_events

    last: dict[str, str | None] = dict.fromkeys(turns)
    ended: set[str] = set()
    paused: dict[str, tuple[float, TurnEvent]] = {}
    deadline = time.monotonic() + timeout_s
    while len(ended) < len(turns) and time.monotonic() < deadline:
        for label, result in turns.items():
            for event in iter_events(result.id, after=last[label], block_s=0):
                last[label] = event.id
                if event.type in ("tool.finished",):
                    continue
                say(f"{label:7} {describe_event(event)}")
                if event.type == "turn.paused":
                    paused[label] = (time.monotonic(), event)
                if event.type in TERMINAL_EVENTS:
                    ended.add(label)
        for label, (since, event) in list(paused.items()):
            if time.monotonic() - since >= APPROVE_AFTER_S:
                approve_all(label, event)
                del paused[label]
        time.sleep(0.05)


def approve_all(label: str, event: TurnEvent) -> None:
    """What a person (or their web handler) does: approve by turn id and request id alone."""
    from tasks import approve_action

    for pending in event.data.get("pending", []):
        say(f"{label:7} the demo approves {pending['tool']} ({pending['requestId']})")
        approve_action(event.turn_id, pending["requestId"], actor="the demo")


def demo_name(prefix: str) -> re.Pattern[str]:
    """What names a key, queue or exchange of the demo's: its prefix as a whole word, at the
    start or after a separator, and followed by `:`, `.` or nothing. Keys start with it
    (`<prefix>:{3}:turn:...`), kombu's name its queues and exchanges
    (`_kombu.binding.<prefix>.turns`, `reply.<prefix>.pidbox`); a demo whose pid starts with
    this one's digits is another demo."""
    return re.compile(rf"(?:^|[^\w-]){re.escape(prefix)}(?:$|[:.])")


def kombu_shared_keys() -> list[str]:
    """The keys kombu's Redis transport shares between every app on one Redis, whose members
    name one app's exchanges: the binding tables' deadlines (a sorted set, in the kombu
    versions that have them)."""
    from kombu.transport.redis import Channel

    deadlines = getattr(Channel, "keyprefix_binding_deadlines", None)
    return [deadlines] if isinstance(deadlines, str) else []


def _text(name: bytes | str) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else name


def remove_demo_keys(client: Any, prefix: str) -> tuple[int, int]:
    """Leave a shared Redis as the demo found it: remove every key whose name carries the
    demo's prefix (its keys, queues, exchanges' binding tables and results), and its members
    of kombu's shared keys (a key left empty is gone with them; another app's members stay).
    Returns (keys removed, members removed)."""
    ours = demo_name(prefix)
    keys = [
        key for key in client.scan_iter(match=f"*{prefix}*", count=1000) if ours.search(_text(key))
    ]
    removed = int(client.delete(*keys)) if keys else 0
    members = 0
    for shared in kombu_shared_keys():
        mine = [
            member
            for member, _ in client.zscan_iter(shared, match=f"*{prefix}*", count=1000)
            if ours.search(_text(member))
        ]
        members += int(client.zrem(shared, *mine)) if mine else 0
    return removed, members


def keep_logs(workdir: Path) -> None:
    """Copy the processes' logs out of the demo's temporary directory, which is removed."""
    kept = Path(tempfile.mkdtemp(prefix="agentjobs-demo-logs-"))
    for log in workdir.glob("*.log"):
        shutil.copy(log, kept / log.name)
    say(f"their logs are kept in {kept}")


def show_dead_letters(env: dict[str, str]) -> bool:
    """Run `agentjobs dlq list` as an operator would, in the demo's environment, and print what
    it prints. False when the command failed."""
    say("the dead-letter store, as `agentjobs dlq list` shows it:")
    # Its output is piped through this process: it gets this terminal's width, not a pipe's.
    columns = str(shutil.get_terminal_size((200, 24)).columns)
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "dlq", "list"],
        env={**env, "COLUMNS": columns},
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        say(f"`agentjobs dlq list` failed (exit status {done.returncode}): {done.stderr.strip()}")
        return False
    return True


def metrics_port_for(requested: int | None, default: int | None = None) -> int:
    """The port the demo's metrics exporter listens on: the one asked for, else the Procfile's
    (`default`: 9808) when nothing listens there, else a free one."""
    from tasks.testing import METRICS_PORT, free_port, port_is_free

    if requested is not None:
        return requested
    port = METRICS_PORT if default is None else default
    return port if port_is_free(port) else free_port()


def console_port() -> int | None:
    """Where the demo's console listens (8088, else a free port), or None without the `web`
    extra (the demo then runs without it)."""
    import importlib.util

    from tasks.testing import WEB_PORT, free_port, port_is_free

    if any(importlib.util.find_spec(m) is None for m in ("starlette", "uvicorn", "jinja2")):
        return None
    return WEB_PORT if port_is_free(WEB_PORT) else free_port()


def run_demo(redis_url: str, workdir: Path, *, shared: bool, metrics_port: int) -> int:
    from tasks.testing import READY, Process, procfile, start_process, wait_until

    env = demo_env(redis_url)
    # This process is the demo's client: same settings as its processes.
    os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS_"))})
    from tasks import TurnDeadLettered, app, load_conversation, run_turn
    from tasks.queue.context import job_context

    processes: list[Process] = []
    try:
        web_port = console_port()
        commands = procfile(metrics_port=metrics_port, web_port=web_port or 0)
        if web_port is None:
            del commands["web"]
            say("the console (agentjobs web) needs the web extra: pip install 'agentjobs[web]'")
        for name, command in commands.items():
            try:
                processes.append(start_process(name, command, env, workdir, ready=READY[name]))
            except (RuntimeError, AssertionError) as exc:  # died at start, or never ready
                say(f"{name} did not start: {exc}")
                keep_logs(workdir)
                return 1
            say(f"started {name} (pid {processes[-1].pid}): {command}")
            if name == "web":
                say(f"the console: http://127.0.0.1:{web_port}/ (open it; it stops with the demo)")
        wait_until(lambda: app.control.ping(timeout=0.5), 30, "the worker to answer a ping")
        say(f"worker ready; submitting {len(TURNS)} turns")
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
        return 0 if show_dead_letters(env) else 1
    finally:
        for process in processes:
            process.terminate()  # all at once: each takes a second or two to shut down
        for process in processes:
            process.stop()
        say(f"stopped the {', '.join(p.name for p in processes)}")
        if shared:
            keys, members = remove_demo_keys(job_context().redis, env["AGENTJOBS_KEY_PREFIX"])
            say(
                f"removed the demo's {keys} keys from the shared Redis, and its {members} "
                "entries in kombu's shared binding deadlines"
            )


def main(metrics_port: int | None = None) -> int:
    """Run the demo; 0 when it ran through. `metrics_port`: where its metrics exporter
    listens (default: 9808, or a free port when something else listens there)."""
    import redis

    from tasks.core.settings import load_settings
    from tasks.testing import METRICS_PORT, RedisServer, port_is_free, redis_answers

    port = metrics_port_for(metrics_port)
    if metrics_port is not None and not port_is_free(port):
        say(f"port {port} (asked for the metrics exporter) is in use: pick another")
        return 1
    if port != METRICS_PORT:
        reason = "asked for" if metrics_port is not None else f"port {METRICS_PORT} is in use"
        say(f"the demo's metrics exporter listens on port {port} ({reason})")
    with tempfile.TemporaryDirectory(prefix="agentjobs-demo-") as tmp:
        workdir = Path(tmp)
        configured = load_settings().redis_url
        if redis_answers(redis.Redis.from_url(configured, socket_timeout=1)):
            say("using the configured Redis (REDIS_URL); the demo's keys and queues are prefixed")
            return run_demo(configured, workdir, shared=True, metrics_port=port)
        if not RedisServer.available():
            say(
                "no Redis answers at REDIS_URL (default 127.0.0.1:6379): set it, or install "
                "redis-server (Debian/Ubuntu: apt-get install redis-server; macOS: brew install "
                "redis) and the demo starts a private one"
            )
            return 1
        server = RedisServer(workdir / "redis").start()
        say(f"started a private redis-server on port {server.port}")
        try:
            return run_demo(server.url, workdir, shared=False, metrics_port=port)
        finally:
            server.stop()
            say("stopped the private redis-server")


if __name__ == "__main__":
    raise SystemExit(main())
