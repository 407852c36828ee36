"""Throughput of the job system against bare Celery on this machine, in one run, on one private
Redis, with the Procfile's worker flags for both sides (`--pool threads --loglevel INFO`, and
Celery's default concurrency, the CPU count, unless --concurrency says otherwise):

  P1  (b) run_turn, an instant provider          against (a) a bare Celery no-op task
  P1' (f) run_turn, one tool round               against (e) the same agent run in memory
                                                     inside a bare Celery task
  P2  (c) run_turn, a provider sleeping 200 ms   against (d) a bare Celery task sleeping 200 ms

Our side runs as the Procfile does: a worker and the pump; the bare side on a worker of its
own. All three run for the whole run, each side idle while the other is measured, and each
ratio comes from its two measurements back to back, the side that goes first alternating by
round: this machine's speed drifts by 20-40% over a minute, and a ratio of two measurements
half a minute apart carried that drift. The ratios reported are the medians of the rounds.
Each line gives the CPU each process spent per task (the client: a process of its own for each
measurement, see `measure`): on 2 cores their total predicts the rate. Goals: b/a >= 0.9,
f/e >= 0.8, c/d >= 0.95; --strict exits 1 when one is missed.

    .venv/bin/python bench/throughput.py [--rounds 5] [--turns 1000] [--concurrency N] [--strict]
                                         [--fairness] [--pairs b/a f/e c/d]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.agents import PROVIDER_SLEEP_S  # noqa: E402
from tasks.testing import Process, RedisServer, job_env, start_pump, start_worker  # noqa: E402

AGENTS = {
    "instant": "bench.agents:build_instant_agent",
    "one_round": "bench.agents:build_one_round_agent",
    "sleeping": "bench.agents:build_sleeping_agent",
}
GOALS = {"b/a": 0.9, "f/e": 0.8, "c/d": 0.95}
WARM_UP = 200
# Tasks each measurement's client runs before the clock starts (connections, first calls).
CLIENT_WARM_UP = 20
CONVERSATIONS = itertools.count()


# The processes whose CPU a measurement reports per task, by name (pid), besides this one.
WATCHED: dict[str, int] = {}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(label: str, letter: str, count: int, slow: int) -> float:
    """The rate of `count` tasks of measurement `letter` submitted at once and waited for, with
    each process's CPU per task in ms: on 2 cores the total predicts the rate.

    The client is a process of its own for each measurement (`--client`), started and warmed
    up before the clock starts: a client that lives through the whole run carries one
    measurement's leftovers into the next. After a batch of instant tasks, Celery's result
    consumer still has about a thousand unsubscribe confirmations unread on its pubsub connection
    (and buffers the result messages of tasks it had already read by GET), and the next batch
    of the same app reads through them: measured on 2026-12-06, the tool round after an
    instant batch ran 10-15% slower in the same process, and not at all in a fresh one."""
    global MEASUREMENTS
    MEASUREMENTS += 1
    command = [sys.executable, str(Path(__file__).resolve()), "--client", letter]
    command += ["--count", str(count), "--slow", str(slow), "--tag", str(MEASUREMENTS)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the client for ({letter}) stopped before it was ready")
        before = {name: cpu_s(pid) for name, pid in WATCHED.items()}
        child.stdin.write("go\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"the client for ({letter}) stopped before it reported")
        reported = json.loads(line)
        per_task = {"client": reported["cpu_s"] * 1000 / count}
        per_task |= {
            name: (cpu_s(pid) - before[name]) * 1000 / count for name, pid in WATCHED.items()
        }
    except BaseException:
        child.kill()
        raise
    finally:
        child.wait(timeout=60)
    elapsed = reported["elapsed_s"]
    rate = count / elapsed
    cpu = " ".join(f"{name} {ms:.2f}" for name, ms in per_task.items())
    total = sum(per_task.values())
    print(
        f"  {label:40} {count:5d} in {elapsed:6.2f} s {rate:7.1f} /s"
        f"   cpu ms/task: {cpu} = {total:.2f}",
        flush=True,
    )
    CPU_MS[label] = total
    return rate


def run_client(letter: str, count: int, slow: int, tag: str) -> None:
    """One measurement's client (`--client`): warm up, say ready, wait for go, submit `count`
    tasks at once, wait for all of them and report the time and this process's CPU."""
    _, submit, _ = cases(slow, tag)[letter]
    for result in [submit(i) for i in range(CLIENT_WARM_UP)]:
        result.get(timeout=300)
    print("ready", flush=True)
    sys.stdin.readline()
    cpu_before = time.process_time()
    started = time.perf_counter()
    results = [submit(i) for i in range(count)]
    for result in results:
        result.get(timeout=300)
    elapsed = time.perf_counter() - started
    report = {"elapsed_s": elapsed, "cpu_s": time.process_time() - cpu_before}
    print(json.dumps(report), flush=True)


# Measurements started so far: each client's conversations are its own.
MEASUREMENTS = 0
# The last measurement's total CPU per task, in ms, by label.
CPU_MS: dict[str, float] = {}


def start_sides(env: dict[str, str], logs: Path, concurrency: int) -> list[Process]:
    """Both sides' processes, for the whole run: the bare worker (bench.celery_noop, queue
    `celery`) and ours as the Procfile runs it, the pump and a worker (queue
    `agentjobs.turns`). Each side is idle while the other is measured: a worker blocked in
    BRPOP and the idle pump (bench/pump_idle.py: about 3 ms of CPU a second) cost the other
    side well under 1%."""
    processes = [
        start_worker(env, logs, name="bare", app="bench.celery_noop", concurrency=concurrency),
        start_pump(env, logs),
        start_worker(env, logs, name="ours", app="tasks", concurrency=concurrency),
    ]
    WATCHED.update(bare=processes[0].pid, pump=processes[1].pid, ours=processes[2].pid)
    return processes


def cases(slow: int, tag: str = "") -> dict[str, tuple[str, Callable[[int], Any], int | None]]:
    """Each measurement by its letter: its label, how one task is submitted, and how many
    (None: --turns). `tag` keeps one client's conversations apart from another's."""
    from bench.celery_noop import agent_in_memory, noop, sleep
    from tasks import run_turn

    def turn(agent: str) -> Callable[[int], Any]:
        # A conversation of its own per turn, over the whole run: no turn waits behind another.
        return lambda i: run_turn.delay(
            agent=agent, conversation_id=f"{agent}-{tag}-{next(CONVERSATIONS)}", message="hi"
        )

    slow_ms = f"{PROVIDER_SLEEP_S * 1000:.0f} ms"
    return {
        "a": ("(a) bare Celery no-op task", lambda i: noop.delay(), None),
        "b": ("(b) run_turn, instant provider", turn("instant"), None),
        "e": (
            "(e) bare task, one tool round in memory",
            lambda i: agent_in_memory.delay("one_round", "hi"),
            None,
        ),
        "f": ("(f) run_turn, one tool round", turn("one_round"), None),
        "d": (f"(d) bare task sleeping {slow_ms}", lambda i: sleep.delay(PROVIDER_SLEEP_S), slow),
        "c": (f"(c) run_turn, provider sleeping {slow_ms}", turn("sleeping"), slow),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=os.cpu_count() or 1,
        help="worker threads (default: the CPU count, Celery's default, as in the Procfile)",
    )
    parser.add_argument("--turns", type=int, default=1000, help="for (a), (b), (e), (f)")
    parser.add_argument("--rounds", type=int, default=5, help="each pair, this many times")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument(
        "--pairs",
        nargs="+",
        choices=list(GOALS),
        default=list(GOALS),
        help="measure only these pairs (default: all three), for a quicker A/B of one change",
    )
    parser.add_argument(
        "--fairness",
        action="store_true",
        help="our side with the tenant fairness gate on (AGENTJOBS_TENANT_FAIRNESS=1; off by "
        "default), to measure what it costs",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)  # one measurement's client
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--slow", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args.client, args.count, args.slow, args.tag)
        return 0
    # Enough 200 ms tasks to keep every thread busy for several seconds.
    slow = max(args.concurrency * 25, 100)
    goals = {name: GOALS[name] for name in args.pairs}
    ratios: dict[str, list[float]] = {name: [] for name in goals}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in goals}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        assert server.process is not None
        WATCHED["redis"] = server.process.pid
        logs = Path(tmp) / "logs"
        env = job_env(server.url, AGENTS)
        env["AGENTJOBS_TENANT_FAIRNESS"] = "1" if args.fairness else "0"
        # Each measurement's client (a process of its own) is a client of both apps.
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
        print(f"threads pool, concurrency {args.concurrency}, loglevel INFO; {args.rounds} rounds")
        processes = start_sides(env, logs, args.concurrency)
        try:
            measured = cases(slow)
            measured_letters = {letter for name in goals for letter in name.split("/")}
            for warm in sorted(measured_letters & {"a", "b", "e", "f"}):
                label, _, _ = measured[warm]
                measure(f"warm-up {label}", warm, WARM_UP, slow)
            for round_number in range(1, args.rounds + 1):
                print(f"round {round_number}")
                for name in goals:
                    top, bottom = name.split("/")
                    # Each pair back to back, the side that goes first alternating by round:
                    # the machine's drift between the two stays small and cancels out.
                    pair = (bottom, top) if round_number % 2 else (top, bottom)
                    rates = {}
                    for letter in pair:
                        label, _, count = measured[letter]
                        rates[letter] = measure(label, letter, count or args.turns, slow)
                    ratios[name].append(rates[top] / rates[bottom])
                    # The steadier figure: bare CPU per task over ours (all processes).
                    cpu_ratios[name].append(CPU_MS[measured[bottom][0]] / CPU_MS[measured[top][0]])
                shown = "  ".join(
                    f"{name} {values[-1]:.2f} (cpu {cpu_ratios[name][-1]:.2f})"
                    for name, values in ratios.items()
                )
                print(f"  {shown}")
        finally:
            for process in reversed(processes):
                process.stop()
            server.stop()
    print()
    met = []
    for name, goal in goals.items():
        values = ratios[name]
        median = statistics.median(values)
        met.append(median >= goal)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        verdict = "met" if met[-1] else "MISSED"
        cpu = statistics.median(cpu_ratios[name])
        print(
            f"{name} = {median:.2f} (median; rounds {spread})   goal >= {goal}: {verdict}"
            f"   (CPU per task, bare / ours: {cpu:.2f})"
        )
    return 1 if args.strict and not all(met) else 0


if __name__ == "__main__":
    raise SystemExit(main())
