"""What the journal and progress frames cost, in one run on one private Redis and one worker:

  1. one conversation, --turns turns of three tool rounds each, one after the other: each
     turn's time (submit to result) and the bytes every client sent Redis meanwhile (INFO
     total_net_input_bytes), at turn 10 and at the last turn: the median of the turns around
     it, and the mean of the last turns up to it (amortized: a compaction's whole envelope
     shared out over the frames it follows); with the stored conversation's size (envelope
     plus conversation frames) and what the turn's end wrote of it (one frame, or the whole
     envelope when it compacted; before conversation frames, the whole envelope every turn);
  2. throughput of run_turn, many conversations at once: (x) turns that answer without tools
     and (y) turns with one tool round (journal on), and what the round costs (skipped with
     --throughput-turns 0).

Goals: the bytes per turn at turn 300 within 1.5x of turn 10, the per-round write flat, the
per-turn time within 1.5x; the journal under 10% of a turn per tool round (reported, not
asserted).

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
WINDOW = 5  # turns either side of the one reported (medians)
AMORTIZED = 64  # turns up to the one reported (means): a whole cycle of frames at the cap


def bytes_in(client: Any) -> int:
    return int(client.info("stats")["total_net_input_bytes"])


def stored_layout(client: Any, keys: Any, namespace: str) -> tuple[int, int, int]:
    """The stored conversation's (envelope bytes, frame bytes, the last frame's bytes, 0 when
    it has none) in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.strlen(keys.conversation(namespace))
        pipe.lrange(keys.conversation_frames(namespace), 0, -1)
        envelope, frames = pipe.execute()
    return int(envelope), sum(len(f) for f in frames), len(frames[-1]) if frames else 0


def one_conversation(client: Any, turns: int) -> list[tuple[float, int, int, int]]:
    """(seconds, bytes sent to Redis, stored conversation bytes, bytes the turn's end wrote of
    it) for each turn."""
    from tasks import run_turn
    from tasks.queue.context import job_context

    keys, namespace = job_context().keys, "_/_/long"
    # One turn of another conversation first: the scripts load, the connections open.
    run_turn.delay(agent="three_rounds", conversation_id="warm", message="warm").get(timeout=60)
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
        envelope, frame_bytes, last_frame = stored_layout(client, keys, namespace)
        # No frames left: the turn compacted, writing the envelope whole; else its frame.
        written = last_frame if last_frame else envelope
        figures.append((elapsed, sent, envelope + frame_bytes, written))
    return figures


def around(figures: list[tuple[float, int, int, int]], turn: int) -> tuple[float, ...]:
    """Medians of the turns around `turn`: seconds, bytes sent, stored bytes, bytes written."""
    window = figures[max(0, turn - 1 - WINDOW) : turn + WINDOW]
    return tuple(statistics.median(f[i] for f in window) for i in range(4))


def amortized(figures: list[tuple[float, int, int, int]], turn: int) -> tuple[float, float]:
    """Means of the last AMORTIZED turns up to `turn`: bytes sent, bytes written."""
    window = figures[max(0, turn - AMORTIZED) : turn]
    return statistics.mean(f[1] for f in window), statistics.mean(f[3] for f in window)


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
            last = args.turns
            early, late = around(figures, 10), around(figures, last)
            means = {10: amortized(figures, 10), last: amortized(figures, last)}
            for turn, (seconds, sent, stored, written) in ((10, early), (last, late)):
                mean_sent, mean_written = means[turn]
                print(
                    f"   turn {turn:<4} {seconds * 1000:7.1f} ms/turn  sent/turn"
                    f" {sent / 1024:6.1f} KiB (amortized {mean_sent / 1024:6.1f} KiB)  stored"
                    f" {stored / 1024:7.1f} KiB  its end wrote {written / 1024:6.1f} KiB"
                    f" (amortized {mean_written / 1024:6.1f} KiB)  rest per round"
                    f" {(sent - written) / ROUNDS / 1024:5.1f} KiB"
                )
            print(
                f"   bytes sent per turn, turn {last} / turn 10: {late[1] / early[1]:.2f}"
                f" median, {means[last][0] / means[10][0]:.2f} amortized (goal <= 1.5)"
            )
            print(f"   time turn {last} / turn 10: {late[0] / early[0]:.2f} (goal <= 1.5)")
            rest_early = (early[1] - early[3]) / ROUNDS
            rest_late = (late[1] - late[3]) / ROUNDS
            print(
                f"   per-round bytes beyond the conversation write: "
                f"{rest_late / max(rest_early, 1):.2f}x from turn 10 to turn {last}"
                f" (flat is 1.0); writing the whole conversation at each turn's end would send"
                f" {late[2] / 1024:.0f} KiB a turn at turn {last}"
            )
            if args.throughput_turns <= 0:
                return 0
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
