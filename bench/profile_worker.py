"""Where a turn's time goes in a worker: a recipe, not a benchmark.

It runs one `celery -A tasks worker` under cProfile, on a private Redis, with the solo pool (so
every task runs on the main thread, the one cProfile sees), submits turns of an agent of
bench/agents.py, stops the worker (a warm shutdown, so the profile is written) and prints the
functions with the most time: the project's own by cumulative time, all of them by own time.
The client's side is not in it.

    .venv/bin/python bench/profile_worker.py [--agent instant|one_round] [--turns 500]
                                             [--top 30] [--out worker.prof]

The .prof file opens in any pstats viewer (`python -m pstats worker.prof`, snakeviz). cProfile
counts wall time: a call waiting on Redis's reply shows as the time of the socket read. For the
CPU of the threads pool as the Procfile runs it, py-spy sees every thread without changing the
worker, and with --gil only the samples that hold the interpreter (what costs CPU in Python):
`py-spy record --gil --rate 500 --format raw -o worker.txt --pid WORKER_PID` while
bench/throughput.py runs (py-spy is not a dependency of the project; install it where you
profile). bench/redis_cpu.py shows the server's side of a turn, command by command.
"""

from __future__ import annotations

import argparse
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.testing import READY, RedisServer, job_env, start_process  # noqa: E402

AGENTS = {
    "instant": "bench.agents:build_instant_agent",
    "one_round": "bench.agents:build_one_round_agent",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--agent", choices=sorted(AGENTS), default="instant")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="keep the profile here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        profile = args.out or Path(tmp) / "worker.prof"
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            env = job_env(server.url, AGENTS)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
            os.environ.update(
                {k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))}
            )
            from tasks import run_turn

            command = [
                *(sys.executable, "-m", "cProfile", "-o", str(profile)),
                *("-m", "celery", "-A", "tasks", "worker", "--pool", "solo"),
                *("--hostname", "profiled@%h", "--loglevel", "INFO"),
                *("--without-mingle", "--without-gossip"),
            ]
            worker = start_process(
                "profiled", command, env, Path(tmp) / "logs", ready=READY["worker"], cwd=ROOT
            )
            try:
                started = time.perf_counter()
                results = [
                    run_turn.delay(agent=args.agent, conversation_id=f"p{i}", message="hi")
                    for i in range(args.turns)
                ]
                for result in results:
                    result.get(timeout=300)
                elapsed = time.perf_counter() - started
            finally:
                worker.stop()
        finally:
            server.stop()
        print(f"{args.turns} turns of {args.agent!r} in {elapsed:.2f} s (solo pool, profiled)")
        stats = pstats.Stats(str(profile))
        # By cumulative time, the project's own functions (the worker's start-up would fill the
        # top otherwise); by own time, everything (sockets, codecs, Celery, kombu, redis-py).
        print("\n-- the project's functions, by cumulative time --")
        stats.sort_stats("cumulative").print_stats(r"/(tasks|agent)/", args.top)
        print("\n-- every function, by own time --")
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
