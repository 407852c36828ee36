"""Turns per second with the state on a three-master Redis Cluster against one Redis, in one
run: the same broker and result backend (one Redis of their own), the same workers and turns;
only AGENTJOBS_STATE_URL differs. Every server is private, on loopback.

    .venv/bin/python bench/cluster.py [--turns 1500] [--workers 2] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import (  # noqa: E402
    Process,
    RedisClusterServers,
    RedisServer,
    job_env,
    start_worker,
)

AGENTS = {"instant": "bench.agents:build_instant_agent"}
WARM_UP = 200


def measure(label: str, turns: int, prefix: str) -> float:
    from tasks import run_turn

    started = time.perf_counter()
    results = [
        run_turn.delay(agent="instant", conversation_id=f"{prefix}{i}", message="hi")
        for i in range(turns)
    ]
    for result in results:
        result.get(timeout=300)
    elapsed = time.perf_counter() - started
    rate = turns / elapsed
    print(f"{label:34} {turns:6d} turns in {elapsed:6.2f} s  {rate:8.1f} turns/s", flush=True)
    return rate


def run(label: str, env: dict[str, str], logs: Path, args: argparse.Namespace) -> float:
    """Point this process and fresh workers at `env`'s state, warm up, measure."""
    from tasks.queue.context import reset

    os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
    reset()
    workers: list[Process] = [
        start_worker(env, logs, name=f"{label}{n}", concurrency=args.concurrency)
        for n in range(args.workers)
    ]
    try:
        measure(f"warm-up ({label})", WARM_UP, f"{label}-w")
        return measure(f"state on {label}", args.turns, f"{label}-")
    finally:
        for worker in workers:
            worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--turns", type=int, default=1500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        broker = RedisServer(work / "broker").start()
        single = RedisServer(work / "state").start()
        cluster = RedisClusterServers(work / "cluster").start()
        logs = work / "logs"
        try:
            from tasks import app

            app.conf.update(broker_url=broker.url, result_backend=broker.url)
            base = job_env(broker.url, AGENTS)
            print(
                f"{args.workers} workers (threads, concurrency {args.concurrency}); broker and "
                "results on one Redis; instant provider, one turn per conversation"
            )
            one = run("one-redis", {**base, "AGENTJOBS_STATE_URL": single.url}, logs, args)
            three = run("cluster", {**base, "AGENTJOBS_STATE_URL": cluster.url}, logs, args)
        finally:
            cluster.stop()
            single.stop()
            broker.stop()
    print()
    print(f"cluster / one Redis = {three / one:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
