"""Throughput of the job system against bare Celery, on one worker, in one run, one private
Redis, the same pool flags for both:

  (a) a bare Celery no-op task (bench/celery_noop.py: Celery's defaults, prefetch 1, acks_late)
  (b) run_turn with an instant provider (bench/agents.py)
  (d) the bare Celery task sleeping 200 ms
  (c) run_turn with a provider sleeping 200 ms per model call

Each side runs on its own worker, started for its measurements and stopped after them.
Goals, the job system's cost over bare Celery: b/a >= 0.85, c/d >= 0.95. --strict exits 1 when
one is missed.

    .venv/bin/python bench/throughput.py [--concurrency 32] [--turns 1500] [--strict]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.agents import PROVIDER_SLEEP_S  # noqa: E402
from tasks.testing import Process, RedisServer, job_env, start_worker  # noqa: E402

AGENTS = {
    "instant": "bench.agents:build_instant_agent",
    "sleeping": "bench.agents:build_sleeping_agent",
}
GOAL_INSTANT = 0.85
GOAL_SLEEPING = 0.95
WARM_UP = 200


def measure(label: str, submit: Callable[[int], Any], count: int) -> float:
    started = time.perf_counter()
    results = [submit(i) for i in range(count)]
    for result in results:
        result.get(timeout=300)
    elapsed = time.perf_counter() - started
    rate = count / elapsed
    print(f"{label:42} {count:6d} in {elapsed:6.2f} s  {rate:8.1f} /s", flush=True)
    return rate


def worker(env: dict[str, str], logdir: Path, app: str, concurrency: int) -> Process:
    return start_worker(env, logdir, name=app, app=app, concurrency=concurrency)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--turns", type=int, default=1500, help="for (a) and (b)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    slow = max(args.concurrency * 20, 200)
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        logs = Path(tmp) / "logs"
        env = job_env(server.url, AGENTS)
        # This process is the client of both apps.
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
        from bench.celery_noop import noop, sleep
        from tasks import run_turn

        print(f"one worker at a time: threads pool, concurrency {args.concurrency}")
        try:
            bare = worker(env, logs, "bench.celery_noop", args.concurrency)
            try:
                measure("warm-up", lambda i: noop.delay(), WARM_UP)
                a = measure("(a) bare Celery no-op task", lambda i: noop.delay(), args.turns)
                d = measure(
                    f"(d) bare Celery task sleeping {PROVIDER_SLEEP_S * 1000:.0f} ms",
                    lambda i: sleep.delay(PROVIDER_SLEEP_S),
                    slow,
                )
            finally:
                bare.stop()
            ours = worker(env, logs, "tasks", args.concurrency)
            try:
                measure(
                    "warm-up turns",
                    lambda i: run_turn.delay(
                        agent="instant", conversation_id=f"w{i}", message="hi"
                    ),
                    WARM_UP,
                )
                b = measure(
                    "(b) run_turn, instant provider",
                    lambda i: run_turn.delay(
                        agent="instant", conversation_id=f"b{i}", message="hi"
                    ),
                    args.turns,
                )
                c = measure(
                    f"(c) run_turn, provider sleeping {PROVIDER_SLEEP_S * 1000:.0f} ms",
                    lambda i: run_turn.delay(
                        agent="sleeping", conversation_id=f"c{i}", message="hi"
                    ),
                    slow,
                )
            finally:
                ours.stop()
        finally:
            server.stop()
    print()
    met = [b / a >= GOAL_INSTANT, c / d >= GOAL_SLEEPING]
    print(f"b/a = {b / a:.2f}   (goal >= {GOAL_INSTANT}: {'met' if met[0] else 'MISSED'})")
    print(f"c/d = {c / d:.2f}   (goal >= {GOAL_SLEEPING}: {'met' if met[1] else 'MISSED'})")
    return 1 if args.strict and not all(met) else 0


if __name__ == "__main__":
    raise SystemExit(main())
