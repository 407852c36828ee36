"""Where Redis's time goes per turn: the server's own CPU and its per-command times (INFO cpu,
INFO commandstats), for run_turn against a bare Celery task, through real workers with the
Procfile's flags (threads pool, Celery's default concurrency, INFO) and, for ours, the pump.

A script's line (evalsha) holds the commands it ran (their own lines count them again) and the
Lua around them: the difference is what scripts cost beyond their commands. The server's CPU
also holds reading and writing the sockets, which commandstats leaves out. It prints figures
and asserts nothing.

    .venv/bin/python bench/redis_cpu.py [--agent instant|one_round] [--turns 3000] [--top 18]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import Process, RedisServer, job_env, start_pump, start_worker  # noqa: E402

AGENTS = {
    "instant": "bench.agents:build_instant_agent",
    "one_round": "bench.agents:build_one_round_agent",
}
WARM_UP = 300


def server_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(
    label: str, client: redis.Redis, submit: Callable[[int], Any], turns: int, top: int
) -> None:
    for result in [submit(i) for i in range(WARM_UP)]:
        result.get(timeout=120)
    client.config_resetstat()
    cpu_before = server_cpu_s(client)
    started = time.perf_counter()
    for result in [submit(WARM_UP + i) for i in range(turns)]:
        result.get(timeout=300)
    elapsed = time.perf_counter() - started
    cpu_us = (server_cpu_s(client) - cpu_before) * 1e6 / turns
    stats = client.info("commandstats")
    rows = sorted(
        (
            (s["usec"] / turns, s["calls"] / turns, name.removeprefix("cmdstat_"))
            for name, s in stats.items()
        ),
        reverse=True,
    )
    inner = sum(usec for usec, _, name in rows if name not in ("evalsha", "config|resetstat"))
    scripts = next((usec for usec, _, name in rows if name == "evalsha"), 0.0)
    print(f"{label}: {turns} turns at {turns / elapsed:.0f}/s")
    print(
        f"  Redis CPU {cpu_us:.0f} us a turn; evalsha {scripts:.0f} us (the scripts' commands "
        f"and their Lua); every other command {inner:.0f} us (the scripts' commands again among "
        "them)"
    )
    for usec, calls, name in rows[:top]:
        if name != "config|resetstat":
            print(f"  {name:24} {usec:7.1f} us  x{calls:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--agent", choices=sorted(AGENTS), default="instant")
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args()
    concurrency = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        env = job_env(server.url, AGENTS)
        env["AGENTJOBS_TENANT_FAIRNESS"] = "0"
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
        client = redis.Redis.from_url(server.url)
        logs = Path(tmp) / "logs"
        from bench.celery_noop import agent_in_memory, noop
        from tasks import run_turn

        try:
            bare: Callable[[int], Any] = (
                (lambda i: noop.delay())
                if args.agent == "instant"
                else (lambda i: agent_in_memory.delay(args.agent, "hi"))
            )
            worker = start_worker(
                env, logs, name="bare", app="bench.celery_noop", concurrency=concurrency
            )
            try:
                measure(f"bare Celery task ({args.agent})", client, bare, args.turns, args.top)
            finally:
                worker.stop()
            processes: list[Process] = [
                start_pump(env, logs),
                start_worker(env, logs, name="ours", app="tasks", concurrency=concurrency),
            ]
            try:
                measure(
                    f"run_turn ({args.agent})",
                    client,
                    lambda i: run_turn.delay(
                        agent=args.agent, conversation_id=f"c{i}", message="hi"
                    ),
                    args.turns,
                    args.top,
                )
            finally:
                for process in reversed(processes):
                    process.stop()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
