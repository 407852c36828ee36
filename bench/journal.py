"""What the journal and progress frames cost, in one run on one private Redis and one worker:

  1. one conversation, --turns turns of three tool rounds each, one after the other: each
     turn's time (submit to result) and the bytes every client sent Redis meanwhile (INFO
     total_net_input_bytes), at turn 10 and at the last turn, with the stored conversation's
     size (a turn writes it once, at its end; before frames, each round wrote it again too);
  2. throughput of run_turn, many conversations at once: (x) turns that answer without tools
     and (y) turns with one tool round (journal on), and what the round costs.

Goals: the per-round write flat from turn 10 to turn 300, the per-turn time within 1.5x; the
journal under 10% of a turn per tool round (reported, not asserted).

    .venv/bin/python bench/journal.py [--turns 300] [--throughput-turns 1000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import RedisServer, job_env, start_worker  # noqa: E402

AGENTS = {
    "instant": "bench.agents:build_instant_agent",
    "one_round": "bench.agents:build_one_round_agent",
    "three_rounds": "bench.agents:build_three_rounds_agent",
}
ROUNDS = 3
WINDOW = 5  # turns either side of the one reported


def bytes_in(client: Any) -> int:
    return int(client.info("stats")["total_net_input_bytes"])


def one_conversation(client: Any, turns: int) -> list[tuple[float, int, int]]:
    """(seconds, bytes sent to Redis, stored conversation bytes) for each turn."""
    from tasks import run_turn
    from tasks.queue.context import job_context

    key = job_context().keys.conversation("_/_/long")
    # INFO's own request is counted too: measured once and taken off.
    before = bytes_in(client)
    info_cost = bytes_in(client) - before
    figures = []
    for n in range(turns):
        before = bytes_in(client)
        started = time.perf_counter()
        run_turn.delay(agent="three_rounds", conversation_id="long", message=f"turn {n + 1}").get(
            timeout=60
        )
        elapsed = time.perf_counter() - started
        sent = bytes_in(client) - before - info_cost
        figures.append((elapsed, sent, int(client.strlen(key))))
    return figures


def around(figures: list[tuple[float, int, int]], turn: int) -> tuple[float, float, float]:
    window = figures[max(0, turn - 1 - WINDOW) : turn + WINDOW]
    return (
        statistics.median(f[0] for f in window),
        statistics.median(f[1] for f in window),
        statistics.median(f[2] for f in window),
    )


def throughput(agent: str, count: int, prefix: str) -> float:
    from tasks import run_turn

    started = time.perf_counter()
    results = [
        run_turn.delay(agent=agent, conversation_id=f"{prefix}{i}", message="hi")
        for i in range(count)
    ]
    for result in results:
        result.get(timeout=300)
    return count / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--throughput-turns", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    import redis

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        env = job_env(server.url, AGENTS)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
        client = redis.Redis.from_url(server.url)
        worker = start_worker(env, Path(tmp) / "logs", concurrency=args.concurrency)
        try:
            print(f"1. one conversation, {args.turns} turns of {ROUNDS} tool rounds each")
            figures = one_conversation(client, args.turns)
            early, late = around(figures, 10), around(figures, args.turns)
            for label, (seconds, sent, stored) in (
                ("turn 10", early),
                (f"turn {args.turns}", late),
            ):
                per_round = (sent - stored) / ROUNDS
                print(
                    f"   {label:9} {seconds * 1000:7.1f} ms/turn  {sent / 1024:8.1f} KiB sent"
                    f"/turn  conversation {stored / 1024:8.1f} KiB  rest per round"
                    f" {per_round / 1024:6.1f} KiB"
                )
            ratio = late[0] / early[0]
            rest_early = (early[1] - early[2]) / ROUNDS
            rest_late = (late[1] - late[2]) / ROUNDS
            print(f"   time turn {args.turns} / turn 10: {ratio:.2f} (goal <= 1.5)")
            print(
                f"   per-round bytes beyond the one conversation write: "
                f"{rest_late / max(rest_early, 1):.2f}x from turn 10 to turn {args.turns}"
                f" (flat is 1.0); rewriting the conversation each round would add"
                f" {late[2] * ROUNDS / 1024:.0f} KiB a turn at turn {args.turns}"
            )
            print(f"\n2. throughput, {args.throughput_turns} turns, concurrency {args.concurrency}")
            throughput("instant", 200, "warm")
            x = throughput("instant", args.throughput_turns, "x")
            y = throughput("one_round", args.throughput_turns, "y")
            print(f"   (x) no tools              {x:8.1f} turns/s")
            print(f"   (y) one tool round        {y:8.1f} turns/s")
            print(
                f"   a tool round (model call, tool, journal, progress) adds"
                f" {(x / y - 1) * 100:.0f}% to a turn's cost (y/x = {y / x:.2f})"
            )
        finally:
            worker.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
