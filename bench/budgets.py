"""Shared provider budgets and tenant fairness against real workers, on one private Redis, with
the provider of tests/tasks/budget_agents.py, which logs every call it answers (when, and the
tokens it reported) so the windows are measured from the provider's side:

  (a) budget     AGENTJOBS_BUDGETS="fake:m1=requests:R/Ws,tokens:T/Ws", two threads workers of
                 concurrency 8, calls of 20 ms, --turns turns on distinct conversations. For each
                 limit: the busiest sliding window of the log (must be <= the limit) and the
                 utilisation, answered / (limit * busy_s / window_s), busy from first to last call.
  (b) fairness   one worker of concurrency 8, calls of 50 ms; beta's 20 turns alone, then behind
                 --flood turns of acme (tenant fairness on: goal <= 2x alone), then behind
                 --fifo-flood turns of acme with AGENTJOBS_TENANT_FAIRNESS=0 (the FIFO baseline,
                 scaled to --flood).

    .venv/bin/python bench/budgets.py [--turns 300] [--flood 5000] [--fifo-flood 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import Process, RedisServer, job_env, start_pump, start_worker  # noqa: E402
from tests.tasks.budget_agents import LOG_KEY  # noqa: E402

AGENTS = {"metered": "tests.tasks.budget_agents:build_metered_agent"}
FAIRNESS_GOAL = 2.0


def configure_client(env: dict[str, str]) -> None:
    """This process is the client: its AGENTJOBS_* and REDIS_URL are the run's."""
    from tasks.queue.context import reset

    for key in list(os.environ):
        if key.startswith("AGENTJOBS_"):
            del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS_URL"))})
    reset()


@contextmanager
def system(
    env: dict[str, str], logs: Path, client: redis.Redis, workers: int, concurrency: int
) -> Iterator[list[Process]]:
    """A flushed database, the client configured, the pump and `workers` workers; on leaving,
    every process started here stopped and the database flushed again."""
    client.flushdb()
    configure_client(env)
    processes: list[Process] = []
    try:
        processes.append(start_pump(env, logs))
        for n in range(workers):
            processes.append(start_worker(env, logs, name=f"w{n + 1}", concurrency=concurrency))
        yield processes
    finally:
        for process in reversed(processes):
            process.stop()
        client.flushdb()


def provider_log(client: redis.Redis) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in client.lrange(LOG_KEY, 0, -1)]


def submit(tenant: str, n: int, tag: str) -> list[Any]:
    from tasks import run_turn

    return [
        run_turn.delay(
            agent="metered",
            conversation_id=f"{tag}-{tenant}-{i}",
            message=f"{tenant} {i}",
            identity={"tenant": tenant},
        )
        for i in range(n)
    ]


def busiest_window(answered: list[tuple[float, float]], window_ms: float) -> float:
    """The most any span of `window_ms` holds of (at_ms, amount), sorted by at (two pointers)."""
    best = total = 0.0
    left = 0
    for at, amount in answered:
        total += amount
        while answered[left][0] <= at - window_ms:
            total -= answered[left][1]
            left += 1
        best = max(best, total)
    return best


def parse_limit(piece: str) -> tuple[str, float, float]:
    """'requests:50/2s' -> ('requests', 50, 2.0)."""
    kind, _, rest = piece.partition(":")
    amount, _, window = rest.partition("/")
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if window.endswith(suffix):
            return kind, float(amount), float(window[: -len(suffix)]) * units[suffix]
    raise ValueError(f"cannot read the window of {piece!r}")


def budget_bench(base: dict[str, str], logs: Path, client: redis.Redis, args: Any) -> list[str]:
    budget = f"fake:m1={args.requests},{args.tokens}"
    env = {**base, "AGENTJOBS_BUDGETS": budget, "AGENTJOBS_TEST_CALL_S": "0.02"}
    print(f"(a) budget {budget}: 2 workers x 8 threads, 20 ms calls, {args.turns} turns")
    problems: list[str] = []
    with system(env, logs, client, workers=2, concurrency=8):
        started = time.perf_counter()
        results = submit("acme", args.turns, "budget")
        submitted = time.perf_counter() - started
        replies = [r.get(timeout=600) for r in results]
        took = time.perf_counter() - started
        log = provider_log(client)
    answered = sorted((e["at"], e) for e in log if e["status"] == 200)
    refused = sum(1 for e in log if e["status"] != 200)
    ok = sum(1 for r in replies if str(r.get("content", "")).startswith("answered:"))
    print(
        f"  {len(replies)} turns in {took:.2f} s (submitted in {submitted:.2f} s), "
        f"{ok} answered; provider log: {len(answered)} answered, {refused} refused"
    )
    if len(answered) != args.turns:
        problems.append(f"(a) the provider answered {len(answered)} calls for {args.turns} turns")
    busy_ms = answered[-1][0] - answered[0][0] if len(answered) > 1 else 0.0
    print(f"  busy period (first to last answer): {busy_ms / 1000:.2f} s")
    for piece, key in ((args.requests, None), (args.tokens, "tokens")):
        kind, limit, window_s = parse_limit(piece)
        points = [(at, float(e[key]) if key else 1.0) for at, e in answered]
        busiest = busiest_window(points, window_s * 1000)
        total = sum(n for _, n in points)
        capacity = limit * (busy_ms / 1000) / window_s
        utilisation = total / capacity if capacity else float("nan")
        verdict = "ok" if busiest <= limit else "OVER THE LIMIT"
        print(
            f"  {kind:8} limit {limit:7.0f}/{window_s:g}s: busiest window {busiest:7.0f} "
            f"({verdict}); answered {total:7.0f} over {busy_ms / 1000:.2f} s, "
            f"utilisation {utilisation:.2f}"
        )
        if busiest > limit:
            problems.append(f"(a) {kind}: a window held {busiest:.0f} > {limit:.0f}")
    return problems


def beta_wait(client: redis.Redis, tag: str) -> tuple[float, int]:
    """Submit beta's 20 turns, wait for them: seconds from submission to the last result, and
    how many of acme's calls the provider had answered by then."""
    started = time.perf_counter()
    results = submit("beta", 20, tag)
    for result in results:
        result.get(timeout=900)
    wait = time.perf_counter() - started
    acme_done = sum(
        1 for e in provider_log(client) if e["text"].startswith("acme") and e["status"] == 200
    )
    return wait, acme_done


def flood_run(
    env: dict[str, str], logs: Path, client: redis.Redis, flood: int, tag: str
) -> tuple[float, int, float]:
    with system(env, logs, client, workers=1, concurrency=8):
        started = time.perf_counter()
        submit("acme", flood, tag)
        submitted = time.perf_counter() - started
        deadline = time.monotonic() + 120
        while not client.llen(LOG_KEY):
            if time.monotonic() > deadline:
                raise RuntimeError("acme's first calls did not appear within 120 s")
            time.sleep(0.02)
        before = client.llen(LOG_KEY)
        wait, acme_done = beta_wait(client, tag)
    return wait, acme_done - before, submitted


def fairness_bench(base: dict[str, str], logs: Path, client: redis.Redis, args: Any) -> list[str]:
    env = {**base, "AGENTJOBS_TEST_CALL_S": "0.05", "AGENTJOBS_TENANT_FAIRNESS": "1"}
    fifo = {**env, "AGENTJOBS_TENANT_FAIRNESS": "0"}
    print("(b) fairness: 1 worker x 8 threads, 50 ms calls, beta submits 20 turns")
    problems: list[str] = []
    with system(env, logs, client, workers=1, concurrency=8):
        alone, _ = beta_wait(client, "alone")
    print(f"  beta alone:                          {alone:6.2f} s")

    fair, acme_fair, submitted = flood_run(env, logs, client, args.flood, "fair")
    ratio = fair / alone
    verdict = "met" if ratio <= FAIRNESS_GOAL else "MISSED"
    rate = args.flood / submitted
    print(f"  acme's {args.flood} turns submitted in {submitted:.2f} s ({rate:.0f}/s)")
    print(
        f"  beta behind {args.flood} acme, fairness: {fair:6.2f} s = {ratio:.2f}x alone "
        f"(goal <= {FAIRNESS_GOAL:g}x: {verdict}); acme calls answered meanwhile: {acme_fair}"
    )
    if ratio > FAIRNESS_GOAL:
        problems.append(f"(b) beta waited {ratio:.2f}x alone behind the flood, with fairness")

    fifo_wait, acme_fifo, fifo_submitted = flood_run(fifo, logs, client, args.fifo_flood, "fifo")
    scaled = fifo_wait * args.flood / args.fifo_flood
    print(f"  acme's {args.fifo_flood} turns submitted in {fifo_submitted:.2f} s (FIFO run)")
    print(
        f"  beta behind {args.fifo_flood} acme, FIFO:    {fifo_wait:6.2f} s = "
        f"{fifo_wait / alone:.2f}x alone; acme calls answered meanwhile: {acme_fifo} "
        f"(of {args.fifo_flood} ahead)"
    )
    print(
        f"  FIFO scaled to {args.flood} acme ahead (x{args.flood / args.fifo_flood:.2f}): "
        f"~{scaled:.1f} s = ~{scaled / alone:.0f}x alone"
    )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--turns", type=int, default=300, help="(a): turns submitted")
    parser.add_argument("--requests", default="requests:50/2s", help="(a): the requests limit")
    parser.add_argument("--tokens", default="tokens:1500/2s", help="(a): the tokens limit")
    parser.add_argument("--flood", type=int, default=5000, help="(b): acme's turns, fairness on")
    parser.add_argument("--fifo-flood", type=int, default=600, help="(b): acme's turns, FIFO")
    parser.add_argument("--skip-budget", action="store_true")
    parser.add_argument("--skip-fairness", action="store_true")
    args = parser.parse_args()
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        logs = Path(tmp) / "logs"
        base = job_env(server.url, AGENTS)
        configure_client(base)  # before `tasks` is imported: its app reads REDIS_URL
        client = redis.Redis.from_url(server.url)
        try:
            if not args.skip_budget:
                problems += budget_bench(base, logs, client, args)
            if not args.skip_fairness:
                problems += fairness_bench(base, logs, client, args)
        finally:
            server.stop()
    print()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if not problems:
        print("no problems seen")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
