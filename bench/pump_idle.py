"""What the pump costs when nothing is due, and when many turns fall due at once: the pump
process's CPU time (/proc/<pid>/task/*/schedstat), the Redis servers' CPU (INFO cpu) and the
commands (INFO commandstats deltas, which count the commands a script runs as well as the
script) for the pump that probes first (tasks/store/lua/due_probe.lua) and for the one that
takes from every time index of every shard each tick (pump_once(probe=False): the pump before
the probe), with 16 and 64 shards, on one private Redis and on a private three-master Cluster.
Nothing else talks to those servers. Prints figures; asserts nothing.

    .venv/bin/python bench/pump_idle.py [--seconds 10] [--due 4000] [--no-cluster]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.core.keys import Keys  # noqa: E402
from tasks.testing import (  # noqa: E402
    READY,
    Process,
    RedisClusterServers,
    RedisServer,
    job_env,
    start_process,
    start_pump,
)

TICK_S = 0.5  # the default AGENTJOBS_PUMP_INTERVAL_S
WARM_UP_S = 1.5  # the first ticks load the scripts
# The pump before the probe, as a process: the same module, told not to probe.
SWEEP_ALL = "from tasks.turn.pump import main; main(probe=False)"
# This script's own commands, left out of the counts.
OWN_COMMANDS = ("info", "llen")


def cpu_seconds(pid: int) -> float:
    """CPU time of process `pid`'s threads so far, to the nanosecond (the first field of each
    thread's schedstat; /proc/<pid>/stat counts 10 ms clock ticks, too coarse here)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks) / 1e9


@dataclass(frozen=True)
class Sample:
    """The pump's CPU, and the servers' command counts and CPU, at one moment."""

    at_s: float
    pump_cpu_s: float
    calls: dict[str, int]
    server_cpu_s: float

    @staticmethod
    def take(pump: Process, nodes: Sequence[redis.Redis]) -> Sample:
        calls: dict[str, int] = {}
        server_cpu = 0.0
        for node in nodes:
            stats: dict[str, Any] = node.info("commandstats")
            for name, stat in stats.items():
                command = name.removeprefix("cmdstat_")
                calls[command] = calls.get(command, 0) + int(stat["calls"])
            cpu: dict[str, Any] = node.info("cpu")
            server_cpu += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        return Sample(time.monotonic(), cpu_seconds(pump.pid), calls, server_cpu)

    def since(self, earlier: Sample) -> dict[str, Any]:
        """Per second (and the commands per tick) over the span from `earlier`."""
        span = self.at_s - earlier.at_s
        commands = {
            name: count - earlier.calls.get(name, 0)
            for name, count in self.calls.items()
            if name not in OWN_COMMANDS and count > earlier.calls.get(name, 0)
        }
        ticks = max(1, commands.get("set", 0))  # the pump's heartbeat, once a tick
        per_tick = sorted(((n / ticks, name) for name, n in commands.items()), reverse=True)
        return {
            "seconds": span,
            "pump_cpu_ms_per_s": 1000 * (self.pump_cpu_s - earlier.pump_cpu_s) / span,
            "redis_cpu_ms_per_s": 1000 * (self.server_cpu_s - earlier.server_cpu_s) / span,
            "evalsha_per_s": commands.get("evalsha", 0) / span,
            "commands_per_s": sum(commands.values()) / span,
            "per_tick": ", ".join(f"{name} {n:.1f}" for n, name in per_tick),
        }


@contextmanager
def pump_process(env: dict[str, str], logs: Path, *, probe: bool) -> Iterator[Process]:
    if probe:
        process = start_pump(env, logs)
    else:
        command = [sys.executable, "-c", SWEEP_ALL]
        process = start_process("pump", command, env, logs, ready=READY["pump"], timeout_s=30)
    try:
        yield process
    finally:
        process.stop()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def fill(client: redis.Redis, shards: int, members: int, due_in_ms: int) -> None:
    """`members` members in each time index of each shard, due `due_in_ms` from now."""
    at_ms = server_ms(client) + due_in_ms
    for shard in Keys("agentjobs", shards).all_shards():
        indices = (shard.retries, shard.running, shard.pending, shard.deadlines, shard.pauses)
        for index in (*indices, shard.finished):
            client.zadd(index, {f"m-{shard.shard}-{n}": at_ms for n in range(members)})


def idle(
    env: dict[str, str], nodes: Sequence[redis.Redis], logs: Path, *, probe: bool, seconds: float
) -> dict[str, Any]:
    with pump_process(env, logs, probe=probe) as pump:
        time.sleep(WARM_UP_S)
        first = Sample.take(pump, nodes)
        time.sleep(seconds)
        return Sample.take(pump, nodes).since(first)


def under_load(
    env: dict[str, str], client: redis.Redis, logs: Path, *, probe: bool, due: int
) -> dict[str, Any]:
    """`due` retries falling due at once over 16 shards (of turns without records: each is
    woken, a resume_turn message that no worker takes): until every wake-up is published."""
    shards = Keys("agentjobs", 16).all_shards()
    retry_queue = "agentjobs.retry"
    each = due // len(shards)
    with pump_process(env, logs, probe=probe) as pump:
        time.sleep(WARM_UP_S)
        now_ms = server_ms(client)
        first = Sample.take(pump, [client])
        for shard in shards:
            client.zadd(shard.retries, {f"r-{shard.shard}-{n}": now_ms for n in range(each)})
        deadline = time.monotonic() + 120
        while int(client.llen(retry_queue)) < each * len(shards) and time.monotonic() < deadline:
            time.sleep(0.02)
        figures = Sample.take(pump, [client]).since(first)
    client.delete(retry_queue, *(shard.retries for shard in shards))
    return figures


def report(label: str, figures: dict[str, Any], *, breakdown: bool = True) -> None:
    print(
        f"{label:46} pump CPU {figures['pump_cpu_ms_per_s']:6.2f} ms/s  "
        f"Redis CPU {figures['redis_cpu_ms_per_s']:6.2f} ms/s  "
        f"EVALSHA {figures['evalsha_per_s']:6.1f}/s  "
        f"commands {figures['commands_per_s']:7.1f}/s",
        flush=True,
    )
    if breakdown:
        print(f"{'':46} per tick: {figures['per_tick']}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=10.0, help="each idle measurement")
    parser.add_argument("--due", type=int, default=4000, help="retries due at once (0: none)")
    parser.add_argument("--no-cluster", action="store_true", help="one Redis only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        logs = work / "logs"
        single = RedisServer(work / "state").start()
        cluster = None if args.no_cluster else RedisClusterServers(work / "cluster").start()
        try:
            client = redis.Redis.from_url(single.url)
            print(f"pump tick {TICK_S} s; each idle figure over {args.seconds:.0f} s")
            print("\nidle, every index empty")
            for shards in (16, 64):
                env = job_env(single.url, AGENTJOBS_INDEX_SHARDS=str(shards))
                for probe in (False, True):
                    figures = idle(env, [client], logs, probe=probe, seconds=args.seconds)
                    mode = "probe" if probe else "sweep all"
                    report(f"one Redis, {shards} shards, {mode}", figures)
            print("\nidle, every index holding 100 members due in an hour")
            for shards in (16, 64):
                fill(client, shards, 100, 3_600_000)
                env = job_env(single.url, AGENTJOBS_INDEX_SHARDS=str(shards))
                for probe in (False, True):
                    figures = idle(env, [client], logs, probe=probe, seconds=args.seconds)
                    mode = "probe" if probe else "sweep all"
                    report(f"one Redis, {shards} shards, {mode}", figures)
                client.flushall()
            if cluster is not None:
                print("\nidle on the Cluster, every index empty (its broker: the one Redis)")
                nodes = [redis.Redis(port=s.port) for s in cluster.servers]
                env = job_env(single.url, AGENTJOBS_STATE_URL=cluster.url)
                for probe in (False, True):
                    figures = idle(env, nodes, logs, probe=probe, seconds=args.seconds)
                    mode = "probe" if probe else "sweep all"
                    report(f"3-master Cluster, 16 shards, {mode}", figures)
            if args.due:
                print(f"\n{args.due} retries due at once, 16 shards, until all are woken")
                env = job_env(single.url)
                for probe in (False, True):
                    figures = under_load(env, client, logs, probe=probe, due=args.due)
                    mode = "probe" if probe else "sweep all"
                    report(
                        f"one Redis, {mode}: {figures['seconds']:.2f} s", figures, breakdown=False
                    )
        finally:
            if cluster is not None:
                cluster.stop()
            single.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
