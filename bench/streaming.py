"""What streaming costs the job system: the turn rate of a 200 ms model whose reply streams, against
the same model answering whole, in one run on one private Redis, and the Redis work per turn.

The model is a local HTTP server speaking OpenAI's chat completions: asked to stream, it sends the
reply in 50 SSE chunks over 200 ms; asked without `stream`, it answers whole after 200 ms. Both
agents use OpenAIChatProvider against it (bench/agents.py): `stream` as it is, so every chunk
reaches the worker's token writer; `whole` through a provider without `stream` (CompleteOnly),
so the runtime calls `complete` and tells the worker no text: streaming off, as for any provider
that cannot stream (the reply's text is in turn.succeeded). Each round runs both, whole first;
the figures are the medians of the rounds.

Per turn it prints the rate, the Redis commands the server processed (total_commands_processed,
broker traffic included), the scripts run (EVALSHA), the token.delta events written, counted in
the turns' own streams, and the CPU of each process (this one serves the model and submits).
Goals (printed, not asserted): stream/whole rate >= 0.95 (P2), and token.delta events per
model call at most 200 ms / AGENTJOBS_TOKEN_FLUSH_MS + 2.

    .venv/bin/python bench/streaming.py [--rounds 3] [--turns N] [--concurrency N] [--flush-ms 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import RedisServer, job_env, start_pump, start_worker  # noqa: E402

AGENTS = {
    "stream": "bench.agents:build_streaming_agent",
    "whole": "bench.agents:build_complete_only_agent",
}
MODEL_S = 0.2
CHUNKS = 50
WARM_UP = 50
REPLY = [f"tok{i} " for i in range(CHUNKS)]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return f"data: {json.dumps({'id': 'c', 'choices': [choice]})}\n\n".encode()


# The streamed reply, each event as one HTTP chunk: text chunks, the finish, usage, [DONE].
STREAMED = [_chunk({"content": piece}) for piece in REPLY] + [
    _chunk({}, "stop"),
    b'data: {"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 50}}\n\n',
    b"data: [DONE]\n\n",
]
WHOLE = json.dumps(
    {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(REPLY)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 50},
    }
).encode()


class ModelHandler(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: 50 chunks over MODEL_S when asked to stream, else the whole
    reply after MODEL_S."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each chunk goes out when written

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        if not body.get("stream"):
            time.sleep(MODEL_S)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(WHOLE)))
            self.end_headers()
            self.wfile.write(WHOLE)
            return
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        started = time.monotonic()
        for number, event in enumerate(STREAMED):
            # Paced by the clock, not by sleeps that add up: the reply takes MODEL_S in all.
            pause_s = started + MODEL_S * min(number, CHUNKS) / CHUNKS - time.monotonic()
            if pause_s > 0:
                time.sleep(pause_s)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def model_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ModelHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass(frozen=True)
class Figures:
    rate: float  # turns per second
    commands: float  # Redis commands processed per turn
    scripts: float  # EVALSHA calls per turn
    deltas: float  # token.delta events per turn
    cpu_ms: dict[str, float]  # CPU per turn of each process: on 2 cores the sum sets the rate


# The processes whose CPU is counted, by name (pid): this one (the client and the model server),
# the worker and Redis; filled in by main.
WATCHED: dict[str, int] = {"client+model": os.getpid()}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _counts(client: redis.Redis) -> tuple[int, int]:
    info: Any = client.info("all")
    return int(info["total_commands_processed"]), int(
        info.get("cmdstat_evalsha", {}).get("calls", 0)
    )


def measure(client: redis.Redis, agent: str, count: int, tag: str) -> Figures:
    from tasks import run_turn
    from tasks.queue.context import job_context

    commands, scripts = _counts(client)
    cpu = {name: cpu_s(pid) for name, pid in WATCHED.items()}
    started = time.perf_counter()
    results = [
        run_turn.delay(agent=agent, conversation_id=f"{tag}-{i}", message="hi")
        for i in range(count)
    ]
    for result in results:
        result.get(timeout=300)
    elapsed = time.perf_counter() - started
    cpu_ms = {name: (cpu_s(pid) - cpu[name]) * 1000 / count for name, pid in WATCHED.items()}
    commands_after, scripts_after = _counts(client)
    records = job_context().records
    deltas = 0
    for result in results:
        record = records.get(result.id)
        assert record is not None
        key = records.keys.for_namespace(record.namespace).events(result.id)
        entries: Any = client.xrange(key)
        deltas += sum(f[b"type"] == b"token.delta" for _, f in entries)
    return Figures(
        rate=count / elapsed,
        commands=(commands_after - commands) / count,
        scripts=(scripts_after - scripts) / count,
        deltas=deltas / count,
        cpu_ms=cpu_ms,
    )


def show(label: str, figures: Figures) -> None:
    print(
        f"  {label:28} {figures.rate:7.1f} turns/s   {figures.commands:6.1f} commands/turn"
        f"   {figures.scripts:5.1f} scripts/turn   {figures.deltas:5.2f} token.delta/turn",
        flush=True,
    )
    cpu = "  ".join(f"{name} {ms:.2f}" for name, ms in figures.cpu_ms.items())
    print(f"  {'':28} cpu ms/turn: {cpu} = {sum(figures.cpu_ms.values()):.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=os.cpu_count() or 1,
        help="worker threads (default: the CPU count, as bench/throughput.py's P2)",
    )
    parser.add_argument(
        "--turns", type=int, default=0, help="per measurement (default 25 a thread)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="whole then stream, this many times")
    parser.add_argument(
        "--flush-ms", type=int, default=50, help="AGENTJOBS_TOKEN_FLUSH_MS (default 50)"
    )
    args = parser.parse_args()
    turns = args.turns or max(args.concurrency * 25, 100)
    ratios: list[float] = []
    seen: dict[str, list[Figures]] = {"whole": [], "stream": []}
    with tempfile.TemporaryDirectory() as tmp, model_server() as model_url:
        server = RedisServer(Path(tmp) / "redis").start()
        logs = Path(tmp) / "logs"
        env = job_env(
            server.url,
            AGENTS,
            AGENTJOBS_PROVIDER="openai",
            AGENTJOBS_MODEL="bench",
            OPENAI_BASE_URL=model_url,
            OPENAI_API_KEY="bench-key-not-secret",
            AGENTJOBS_TOKEN_FLUSH_MS=str(args.flush_ms),
        )
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
        client = redis.Redis.from_url(server.url)
        processes = [
            start_pump(env, logs),
            start_worker(env, logs, name="stream", concurrency=args.concurrency),
        ]
        assert server.process is not None
        WATCHED.update(worker=processes[1].pid, redis=server.process.pid)
        print(
            f"threads pool, concurrency {args.concurrency}; {turns} turns a measurement; "
            f"model {MODEL_S * 1000:.0f} ms ({CHUNKS} chunks streamed), flush {args.flush_ms} ms"
        )
        try:
            for agent in AGENTS:
                measure(client, agent, WARM_UP, f"warm-{agent}")
            for round_number in range(1, args.rounds + 1):
                print(f"round {round_number}")
                for agent in ("whole", "stream"):
                    seen[agent].append(measure(client, agent, turns, f"r{round_number}-{agent}"))
                    show(f"({agent})", seen[agent][-1])
                ratios.append(seen["stream"][-1].rate / seen["whole"][-1].rate)
                print(f"  stream/whole rate {ratios[-1]:.3f}")
        finally:
            for process in reversed(processes):
                process.stop()
            server.stop()
    print()
    ratio = statistics.median(ratios)
    print(
        f"stream/whole rate = {ratio:.3f} (median; rounds {min(ratios):.3f}-{max(ratios):.3f})"
        f"   goal >= 0.95: {'met' if ratio >= 0.95 else 'MISSED'}"
    )
    bound = MODEL_S * 1000 / args.flush_ms + 2
    deltas = statistics.median(f.deltas for f in seen["stream"])
    pairs = zip(seen["stream"], seen["whole"], strict=True)
    extra = statistics.median(s.commands - w.commands for s, w in pairs)
    verdict = "met" if deltas <= bound else "MISSED"
    print(
        f"token.delta per turn (one model call) = {deltas:.2f}   goal <= {bound:.0f}: {verdict}; "
        f"streaming adds {extra:.1f} Redis commands a turn"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
