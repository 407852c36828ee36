"""Throughput of the job system on one worker, all in one run against one private Redis:

  (a) a bare Celery no-op task, same broker, pool and concurrency (the baseline)
  (b) run_turn with an instant scripted provider
  (c) run_turn with a provider that sleeps 200 ms, as an I/O-bound model call does

Prints turns per second, b/a, and for (c) the concurrency achieved (rate x 0.2 s).
Targets: b/a >= 0.7; (c) at least 80% of concurrency / 0.2 s.

    .venv/bin/python bench/throughput.py [--concurrency 32] [--turns 1500]
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

from tests.tasks.harness import RedisServer, job_env, start_worker  # noqa: E402


def drain(results: list[Any], timeout_s: float = 300) -> None:
    for result in results:
        result.get(timeout=timeout_s)


def measure(label: str, submit: Callable[[int], Any], count: int) -> float:
    started = time.perf_counter()
    results = [submit(i) for i in range(count)]
    drain(results)
    elapsed = time.perf_counter() - started
    rate = count / elapsed
    print(f"{label:44} {count:6d} in {elapsed:6.2f} s  {rate:8.1f} /s", flush=True)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--turns", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            env = job_env(server.url)
            env["AGENTJOBS_LEASE_TTL_S"] = "30"
            os.environ.update(
                {k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))}
            )
            from bench.celery_noop import noop
            from tasks import app, run_turn

            app.conf.update(broker_url=server.url, result_backend=server.url)
            worker = start_worker(
                env,
                Path(tmp) / "logs",
                concurrency=args.concurrency,
                extra_args=["--include", "bench.celery_noop"],
            )
            try:
                print(
                    f"one worker: threads pool, concurrency {args.concurrency}; Redis {server.url}"
                )
                measure("warm-up", lambda i: noop.delay(), 200)
                measure(
                    "warm-up turns",
                    lambda i: run_turn.delay(agent="demo", conversation_id=f"w-{i}", message="hi"),
                    200,
                )
                a = measure("(a) bare Celery no-op task", lambda i: noop.delay(), args.turns)
                b = measure(
                    "(b) run_turn, instant scripted provider",
                    lambda i: run_turn.delay(agent="demo", conversation_id=f"b-{i}", message="hi"),
                    args.turns,
                )
                slow_turns = max(args.concurrency * 20, 200)
                c = measure(
                    "(c) run_turn, provider sleeping 200 ms",
                    lambda i: run_turn.delay(
                        agent="demo", conversation_id=f"c-{i}", message="hi think:0.2"
                    ),
                    slow_turns,
                )
            finally:
                worker.stop()
        finally:
            server.stop()
    ideal_c = args.concurrency / 0.2
    print()
    print(f"b/a = {b / a:.2f}   (target >= 0.70: {'met' if b / a >= 0.7 else 'NOT met'})")
    print(
        f"(c) = {c:.1f} turns/s = {c / ideal_c:.0%} of concurrency/0.2 s = {ideal_c:.0f}/s; "
        f"concurrency achieved {c * 0.2:.1f} of {args.concurrency} "
        f"(target >= 80%: {'met' if c / ideal_c >= 0.8 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
