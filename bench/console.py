"""The console's `/turns` with a store of --turns turns (default 10,000), on a private Redis:
how long the page takes to answer, served by `agentjobs web` (a process of its own, as
deployed) and asked over HTTP as a browser would.

The turns are registered by the real register script (so each is in its shard's `submitted`
index), over --conversations conversations of three tenants; all but a few hundred are then
marked succeeded, as finished turns are. Each figure is the median and p95 of --rounds requests:
the first page (HTML and JSON), the next page (by its cursor), a state filter on an index
(paused), a state filter on the walk (succeeded), a tenant filter, and one conversation. The
baseline, in the same run, is what a listing cost before the index: a SCAN of every record
(tasks/operate/inspect.py, list_turns), the way `agentjobs turn list` still reads.

    .venv/bin/python bench/console.py [--turns 10000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import READY, RedisServer, free_port, start_process  # noqa: E402

GOAL_MS = 300.0
TENANTS = ("acme", "beta", "gamma")


def fill(client: redis.Redis, turns: int, conversations: int) -> str:
    """Register `turns` turns and end most of them; returns one conversation's id."""
    from tasks.core.namespaces import namespace_for
    from tasks.queue.context import job_context

    ctx = job_context()
    payload = b'{"agent":"demo","message":"hello"}'
    for n in range(turns):
        tenant = TENANTS[n % len(TENANTS)]
        conversation = f"c-{n % conversations}"
        namespace = namespace_for(conversation, {"tenant": tenant})
        ctx.records.register(
            f"t-{n:06d}",
            payload=payload,
            agent="demo",
            conversation_id=conversation,
            namespace=namespace,
            tenant=tenant,
        )
    # All but the last 300 end as succeeded (state field and pending index, as succeed does);
    # 20 of those left are paused (their index), the rest stay queued.
    with client.pipeline(transaction=False) as pipe:
        for shard in ctx.keys.all_shards():
            for raw in client.zrange(shard.pending, 0, -1):  # type: ignore[union-attr]
                turn_id = raw.decode()
                number = int(turn_id.removeprefix("t-"))
                if number < turns - 300:
                    pipe.hset(shard.turn(turn_id), "state", "succeeded")
                    pipe.zrem(shard.pending, turn_id)
                elif number < turns - 280:
                    pipe.hset(shard.turn(turn_id), "state", "paused")
                    pipe.zrem(shard.pending, turn_id)
                    pipe.zadd(shard.pauses, {turn_id: time.time() * 1000 + 3_600_000})
        pipe.execute()
    return "c-7"


def timed(call: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median and p95 of `rounds` calls, in ms (one warm-up call first)."""
    call()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--conversations", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agentjobs-bench-console-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            return run(server.url, Path(tmp), options.turns, options.conversations, options.rounds)
        finally:
            server.stop()


def run(redis_url: str, logs: Path, turns: int, conversations: int, rounds: int) -> int:
    os.environ["REDIS_URL"] = redis_url
    from tasks.operate.inspect import list_turns
    from tasks.queue.context import job_context, reset

    reset()
    client = redis.Redis.from_url(redis_url)
    started = time.perf_counter()
    conversation = fill(client, turns, conversations)
    print(f"{turns:,} turns registered in {time.perf_counter() - started:.1f} s")

    port = free_port()
    command = [str(Path(sys.executable).parent / "agentjobs"), "web", "--port", str(port)]
    env = {"REDIS_URL": redis_url, "PATH": os.environ.get("PATH", "")}
    web = start_process("web", command, env, logs, ready=READY["web"])
    origin = f"http://127.0.0.1:{port}"
    html = {"Accept": "text/html"}
    json = {"Accept": "application/json"}
    worst = 0.0
    try:
        with httpx.Client(base_url=origin, timeout=30) as http:
            cursor = http.get("/turns", headers=json).json()["next"]
            cases: list[tuple[str, str, dict[str, str]]] = [
                ("/turns (HTML, first page)", "/turns", html),
                ("/turns (JSON, first page)", "/turns", json),
                ("/turns?after=cursor (next page)", f"/turns?after={cursor}", html),
                ("/turns?state=paused (an index)", "/turns?state=paused", html),
                ("/turns?state=succeeded", "/turns?state=succeeded", html),
                ("/turns?tenant=beta", "/turns?tenant=beta", html),
                (
                    "/turns?conversation= (one shard)",
                    f"/turns?conversation={conversation}&tenant=beta",
                    html,
                ),
            ]
            print(f"{'request':40} {'median ms':>10} {'p95 ms':>8}")
            for label, path, headers in cases:

                def get(path: str = path, headers: dict[str, str] = headers) -> None:
                    response = http.get(path, headers=headers)
                    assert response.status_code == 200, (path, response.status_code)

                median, p95 = timed(get, rounds)
                worst = max(worst, p95)
                print(f"{label:40} {median:10.1f} {p95:8.1f}")
        ctx = job_context()
        median, p95 = timed(lambda: list_turns(ctx, limit=50), max(3, rounds // 10))
        print(f"{'baseline: SCAN every record (list_turns)':40} {median:10.1f} {p95:8.1f}")
    finally:
        web.stop()
    verdict = "under" if worst < GOAL_MS else "OVER"
    print(f"slowest p95 {worst:.1f} ms: {verdict} the {GOAL_MS:.0f} ms goal")
    return 0 if worst < GOAL_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
