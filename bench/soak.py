"""A reproducible chaos soak of the job system: turns run on while workers are killed and
Redis restarts, and each must end exactly once.

A private redis-server (appendonly), two threads workers (concurrency 16) and the pump run 500
turns over 50 conversations of the soak agent (bench/soak_agent.py): a gateway that fails
15% of model calls with HTTP 503 and 5% with 429 + retry-after, refuses 1% of the turns with
401, and takes 0-300 ms per call; each turn runs 1-2 rounds of a tool with a counted side
effect. Turns are submitted in five waves, 10 s apart. While they run, the soak SIGKILLs worker
1, worker 2 and worker 1 (each restarted 0.5 s later, as a supervisor would) and restarts Redis
once, one event per wave after the first; it also restarts any process that exits on its own,
and records it. Then it checks the run (bench/soak_checks.py), prints a table and exits 1 if a
check failed:
  - every turn ended exactly once (records, worker logs), as planned: succeeded, 401 turns
    dead-lettered non_resumable, exhausted ones max_attempts;
  - each Celery result matches its record (SUCCESS and the result, or TurnDeadLettered and the
    reason);
  - each stored conversation is exactly its succeeded turns, in submission order;
  - a tool call started more than once only if it was in flight at a kill or at the Redis
    restart (snapshots of the running turns just before and just after each event), then only
    with its own idempotency key and the next attempt, never once its outcome was journaled, and
    never for an unsafe tool (every third turn's), whose interrupted calls say
    `[outcome unknown]` instead; the table splits the repeats by why;
  - the dead letters are exactly the 401 turns and the exhausted ones, with readable
    checkpoints;
  - the API key and the endpoint host that the gateway's errors quote appear nowhere: Redis,
    dead letters, Celery results, logs;
  - the chaos landed, and no worker or pump exited on its own.

    .venv/bin/python bench/soak.py [--seed 5150] [--turns 500] [--conversations 50]
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import soak_agent as sa  # noqa: E402
from bench import soak_checks as checks  # noqa: E402
from bench import soak_mixed as mixed  # noqa: E402
from bench.soak_checks import TERMINAL, Finding, PlannedTurn, Turn  # noqa: E402
from bench.soak_mixed import Extras  # noqa: E402
from tasks.core.keys import Keys  # noqa: E402
from tasks.testing import (  # noqa: E402
    Process,
    RedisServer,
    job_env,
    start_process,
    start_pump,
    start_worker,
    wait_until,
)

DEFAULT_SEED = 5150
SETTINGS = {
    "AGENTJOBS_LEASE_TTL_S": "3",
    "AGENTJOBS_PUMP_INTERVAL_S": "0.1",
    "AGENTJOBS_BACKOFF_BASE_S": "0.2",
    "AGENTJOBS_BACKOFF_MAX_S": "2",
    "AGENTJOBS_MAX_ATTEMPTS": "5",
    "AGENTJOBS_STALL_AFTER_S": "5",
    "AGENTJOBS_RESULT_GRACE_S": "2",
}
AGENTS = {"soak": "bench.soak_agent:build_soak_agent"}
WORKERS = ("w1", "w2")
CONCURRENCY = 16
REFUSED_SHARE = 0.01
RESTART_AFTER_S = 0.5
REDIS_DOWN_S = 1.0
# Turns are submitted in waves, so the run outlasts the chaos: each wave holds the next
# turns of every conversation (two of ten by default), so they also queue behind each other.
WAVES = 5
WAVE_INTERVAL_S = 10.0
RECOVERY_TIMEOUT_S = 120.0
RESULTS_TIMEOUT_S = 60.0
# (wave, what, whom): the chaos, one event per wave after the first, once that wave's turns
# run (CHAOS_RUNNING on the worker to kill, fewer in a small run; any for Redis), or at the
# latest CHAOS_LATEST_S after the wave was submitted. Each recovers before the next wave.
CHAOS = (
    (1, "kill", "w1"),
    (2, "redis", ""),
    (3, "kill", "w2"),
    (4, "kill", "w1"),
)
CHAOS_RUNNING = 8
CHAOS_LATEST_S = 5.0


# --- the plan --------------------------------------------------------------------------------


def make_plan(
    seed: int, turns: int, conversations: int, mixed_run: bool = False
) -> list[PlannedTurn]:
    """Turn n goes to conversation n % conversations, so each conversation's turns interleave
    with the others' in submission order; 1% are refused with 401, chosen by the seed. A mixed
    run adds tenants, the turns to cancel and the hung ones (bench/soak_mixed.py)."""
    rng = random.Random(seed)
    refused = set(rng.sample(range(turns), max(1, round(turns * REFUSED_SHARE))))
    plan = [
        PlannedTurn(n, f"c{n % conversations:03d}", rng.choice((1, 2)), n in refused)
        for n in range(turns)
    ]
    return mixed.mixed_plan(rng, plan, seed) if mixed_run else plan


# The mixed run's chaos, shuffled by the seed: 20 worker kills, 3 Redis restarts, 2 deploys
# (each worker stopped with SIGTERM, so it hands its turns over, and started again). The run
# uses a single Redis, so a Sentinel failover is stood in for by the restarts (persistence on).
MIXED_KILLS = 20
MIXED_RESTARTS = 3
MIXED_DEPLOYS = 2


def mixed_chaos(seed: int, turns: int) -> list[tuple[int, str, str]]:
    """The events of a mixed run of `turns` turns: the full set at 10,000, fewer in a smaller
    run (a kill per 500 turns, at least two, and one restart and one deploy)."""
    rng = random.Random(seed + 1)
    kills = min(MIXED_KILLS, max(2, turns // 500))
    restarts = min(MIXED_RESTARTS, max(1, turns // 3000))
    deploys = min(MIXED_DEPLOYS, max(1, turns // 5000))
    events = [("kill", WORKERS[i % len(WORKERS)]) for i in range(kills)]
    events += [("redis", "")] * restarts + [("deploy", "")] * deploys
    rng.shuffle(events)
    return [(wave + 1, kind, name) for wave, (kind, name) in enumerate(events)]


@dataclass(frozen=True)
class Secrets:
    api_key: str
    base_url: str

    @classmethod
    def fresh(cls) -> Secrets:
        return cls(
            f"sk-soak-{secrets.token_hex(12)}",
            f"https://gw-{secrets.token_hex(4)}.soak.invalid/v1",
        )

    @property
    def swept(self) -> list[str]:
        return [self.api_key, urlparse(self.base_url).hostname or self.base_url]


# --- the processes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    """A process that exited on its own (not killed by the soak)."""

    name: str
    at_s: float
    returncode: int | None
    evidence: str


def exit_evidence(log: str) -> str:
    """The line that says why a Celery worker or the pump stopped, if its log has one."""
    for marker in ("Unrecoverable error", "CRITICAL", "Traceback"):
        for line in log.splitlines():
            if marker in line:
                return line.strip()[:300]
    return log.strip().splitlines()[-1][:300] if log.strip() else "(empty log)"


@dataclass
class Cluster:
    """The workers and the pump, supervised: one that exits on its own is started again (and
    recorded), as a process manager would."""

    server: RedisServer
    env: dict[str, str]
    logdir: Path
    workers: dict[str, Process] = field(default_factory=dict)
    pump: Process | None = None
    others: list[Process] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    # The mixed run's person in the loop (bench/soak_decider.py), a process of its own.
    decider: Process | None = None
    with_decider: bool = False

    def start(self) -> None:
        for name in WORKERS:
            self.start_worker(name)
        self.pump = start_pump(self.env, self.logdir)
        if self.with_decider:
            self.start_decider()

    @property
    def decider_stop(self) -> Path:
        return self.logdir / "decider.stop"

    def start_decider(self) -> None:
        command = [sys.executable, str(ROOT / "bench" / "soak_decider.py"), str(self.decider_stop)]
        self.decider = start_process(
            "decider", command, self.env, self.logdir, ready="soak decider started", cwd=ROOT
        )

    def stop_decider(self) -> None:
        if self.decider is not None and self.decider.alive():
            self.decider_stop.touch()
            wait_until(lambda: not self.decider or not self.decider.alive(), 15, "the decider")

    def start_worker(self, name: str) -> None:
        self.workers[name] = start_worker(
            self.env, self.logdir, name=name, pool="threads", concurrency=CONCURRENCY
        )

    def kill_worker(self, name: str) -> None:
        killed = self.workers.pop(name)
        killed.kill()
        self.others.append(killed)

    def supervise(self, since: float) -> None:
        for name, process in list(self.workers.items()):
            if not process.alive():
                self._record_exit(process, since)
                self.start_worker(name)
        if self.pump is not None and not self.pump.alive():
            self._record_exit(self.pump, since)
            self.pump = start_pump(self.env, self.logdir)
        if self.decider is not None and not self.decider.alive():
            self._record_exit(self.decider, since)
            self.start_decider()

    def _record_exit(self, process: Process, since: float) -> None:
        gone = Exit(
            process.name,
            time.monotonic() - since,
            process.popen.returncode,
            exit_evidence(process.log()),
        )
        print(f"  {gone.at_s:6.1f} s  {gone.name} exited on its own: {gone.evidence}", flush=True)
        self.exits.append(gone)
        self.others.append(process)

    def shared(self) -> list[Process]:
        """The processes that should be running: workers, the pump, the decider."""
        extra = [p for p in (self.pump, self.decider) if p is not None]
        return [*self.workers.values(), *extra]

    def processes(self) -> list[Process]:
        return [*self.others, *self.shared()]

    def stop(self) -> None:
        for process in self.processes():
            process.stop()

    def swept_files(self) -> list[Path]:
        """Every log, plus Redis's log and append-only files: those hold every write, also
        values since overwritten or deleted (consumed messages, old errors)."""
        redis_files = sorted(p for p in self.server.workdir.rglob("*") if p.is_file())
        return [p.log_path for p in self.processes()] + redis_files


# --- watching the turn records ---------------------------------------------------------------


@dataclass(frozen=True)
class InFlight:
    """A running turn as its record shows it."""

    task_id: str
    worker: str
    token: str
    # The record's iteration: the turn's iteration in flight, across attempts. A soak turn's
    # iterations are its tool rounds, then the answer, so it is also the round in flight.
    iteration: int
    round: int


class Observer:
    """Reads turn records, waiting out a Redis restart."""

    def __init__(self, client: redis.Redis, keys: Keys, task_ids: list[str]) -> None:
        self.client = client
        self.keys = keys
        self.namespaces: dict[str, str] = {}  # task id -> its conversation's namespace
        self.task_ids = task_ids
        self._ended: set[str] = set()

    def fetch(
        self, ids: list[str], fields: tuple[str, ...], *, snapshot: bool = False
    ) -> dict[str, dict[str, str]]:
        """`fields` of each turn's record; with `snapshot`, all read at one instant (MULTI/EXEC):
        read one after another, the rows could hold a turn that ended beside the one that
        started in its place."""

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=snapshot)
            for task_id in ids:
                pipe.hmget(self.turn_key(task_id), list(fields))
            return pipe.execute()

        rows = sa.patiently(read) if ids else []
        return {
            task_id: {name: (v.decode() if v else "") for name, v in zip(fields, row, strict=True)}
            for task_id, row in zip(ids, rows, strict=True)
        }

    def turn_key(self, task_id: str) -> str:
        namespace = self.namespaces[task_id]
        return self.keys.for_namespace(namespace).turn(task_id)

    def add(self, submitted: list[tuple[str, str]]) -> None:
        for task_id, namespace in submitted:
            self.task_ids.append(task_id)
            self.namespaces[task_id] = namespace

    def open_ids(self) -> list[str]:
        return [t for t in self.task_ids if t not in self._ended]

    def ended(self) -> int:
        for task_id, row in self.fetch(self.open_ids(), ("state",)).items():
            if row["state"] in TERMINAL:
                self._ended.add(task_id)
        return len(self._ended)

    def running(self, worker_prefix: str = "") -> dict[str, InFlight]:
        fields = ("state", "worker", "token", "iteration")
        found: dict[str, InFlight] = {}
        rows = self.fetch(self.open_ids(), fields, snapshot=True)
        for task_id, row in rows.items():
            if row["state"] == "running" and row["worker"].startswith(worker_prefix):
                found[task_id] = InFlight(
                    task_id,
                    row["worker"],
                    row["token"],
                    int(row["iteration"] or 1),
                    int(row["iteration"] or 1),
                )
        return found

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.fetch(self.task_ids, ("state",)).values():
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        return counts

    def records(self) -> dict[str, dict[str, str]]:
        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for task_id in self.task_ids:
                pipe.hgetall(self.turn_key(task_id))
            return pipe.execute()

        return {
            task_id: {k.decode(): v.decode() for k, v in raw.items()}
            for task_id, raw in zip(self.task_ids, sa.patiently(read), strict=True)
        }


def watch_recovery(observer: Observer, stuck: dict[str, str], killed_at: float) -> float | None:
    """Seconds from the kill until every turn the killed worker was running has been seen
    running on another delivery (a new token), waiting, or ended; None if that never came."""
    remaining = dict(stuck)
    while remaining:
        if time.monotonic() - killed_at > RECOVERY_TIMEOUT_S:
            return None
        for task_id, row in observer.fetch(list(remaining), ("state", "token")).items():
            if row["state"] != "running" or row["token"] != remaining[task_id]:
                del remaining[task_id]
        if remaining:
            time.sleep(0.05)
    return time.monotonic() - killed_at


# --- the chaos -------------------------------------------------------------------------------


@dataclass
class ChaosEvent:
    label: str
    at_s: float
    # (task id, round) in flight at the event: the snapshots just before and just after.
    in_flight: set[tuple[str, int]]
    # Turns running on the killed worker (0 for the Redis restart).
    affected: int = 0
    recovery: Future[float | None] | None = None
    down_s: float = 0.0
    # Rounds in flight at this event that ran more than once (filled in after the run).
    repeated: int = 0

    def recovery_s(self) -> float | None:
        return self.recovery.result() if self.recovery is not None else None


def rounds_of(snapshot: dict[str, InFlight]) -> set[tuple[str, int]]:
    return {(f.task_id, f.round) for f in snapshot.values()}


def kill_event(
    cluster: Cluster, observer: Observer, name: str, since: float, pool: ThreadPoolExecutor
) -> ChaosEvent:
    prefix = f"{name}@"
    before = observer.running(prefix)
    killed_at = time.monotonic()
    cluster.kill_worker(name)
    after = observer.running(prefix)
    stuck = {task_id: f.token for task_id, f in after.items()}
    recovery = pool.submit(watch_recovery, observer, stuck, killed_at)
    time.sleep(RESTART_AFTER_S)
    cluster.start_worker(name)
    in_flight = rounds_of(before) | rounds_of(after)
    return ChaosEvent(f"kill {name}", killed_at - since, in_flight, len(after), recovery)


def deploy_event(
    cluster: Cluster, observer: Observer, since: float, pool: ThreadPoolExecutor
) -> ChaosEvent:
    """A deploy: each worker in turn stopped with SIGTERM (it hands its turns over at their
    next check point and exits) and started again."""
    started_at = time.monotonic()
    in_flight: set[tuple[str, int]] = set()
    affected = 0
    stuck: dict[str, str] = {}
    for name in WORKERS:
        before = observer.running(f"{name}@")
        stopping = cluster.workers.pop(name)
        stopping.stop()
        cluster.others.append(stopping)
        after = observer.running(f"{name}@")
        stuck.update({task_id: f.token for task_id, f in after.items()})
        in_flight |= rounds_of(before) | rounds_of(after)
        affected += len(before)
        cluster.start_worker(name)
    recovery = pool.submit(watch_recovery, observer, stuck, started_at)
    return ChaosEvent("deploy", started_at - since, in_flight, affected, recovery)


def redis_event(cluster: Cluster, observer: Observer, since: float) -> ChaosEvent:
    before = observer.running()
    stopped_at = time.monotonic()
    cluster.server.stop()
    time.sleep(REDIS_DOWN_S)
    cluster.server.start()
    down_s = time.monotonic() - stopped_at
    after = observer.running()
    in_flight = rounds_of(before) | rounds_of(after)
    return ChaosEvent("restart redis", stopped_at - since, in_flight, down_s=down_s)


def split_waves(plan: list[PlannedTurn], waves: int) -> list[list[PlannedTurn]]:
    """Contiguous chunks in submission order: with turns dealt round-robin to conversations,
    each wave holds the next few turns of every conversation."""
    size = -(-len(plan) // waves)
    return [plan[i : i + size] for i in range(0, len(plan), size)]


@dataclass
class Driver:
    """Submits the waves and runs the chaos on schedule until every turn has ended."""

    cluster: Cluster
    observer: Observer
    since: float
    pool: ThreadPoolExecutor
    waves: list[list[PlannedTurn]]
    schedule: list[tuple[int, str, str]] = field(default_factory=lambda: list(CHAOS))
    submitted_at: list[float] = field(default_factory=list)
    events: list[ChaosEvent] = field(default_factory=list)
    # Running turns that make an event due: a worker runs at most min(conversations, threads).
    enough_running: int = CHAOS_RUNNING
    extras: Extras | None = None  # the mixed run's actors

    def wave_due(self, now: float) -> bool:
        return bool(self.waves) and (
            not self.submitted_at or now >= self.submitted_at[-1] + WAVE_INTERVAL_S
        )

    def event_due(self, now: float) -> bool:
        if not self.schedule or len(self.submitted_at) <= self.schedule[0][0]:
            return False
        wave, kind, name = self.schedule[0]
        if now >= self.submitted_at[wave] + CHAOS_LATEST_S:
            return True
        running = self.observer.running(f"{name}@" if kind == "kill" else "")
        if kind == "deploy":
            return len(running) >= self.enough_running
        return len(running) >= self.enough_running

    def submit_wave(self, now: float) -> None:
        wave = self.waves.pop(0)
        submitted = submit(wave)
        self.observer.add(submitted)
        if self.extras is not None:
            self.extras.submitted(wave, [task_id for task_id, _ in submitted])
        self.submitted_at.append(time.monotonic())
        print(f"  {now - self.since:6.1f} s  submitted wave {len(self.submitted_at)}", flush=True)

    def run_event(self) -> None:
        _, kind, name = self.schedule.pop(0)
        if kind == "kill":
            event = kill_event(self.cluster, self.observer, name, self.since, self.pool)
        elif kind == "deploy":
            event = deploy_event(self.cluster, self.observer, self.since, self.pool)
        else:
            event = redis_event(self.cluster, self.observer, self.since)
        print(f"  {event.at_s:6.1f} s  {event.label}: {len(event.in_flight)} rounds in flight")
        self.events.append(event)

    def finished(self) -> bool:
        if self.waves or self.schedule:
            return False
        return self.observer.ended() == len(self.observer.task_ids)


def drive(
    cluster: Cluster,
    observer: Observer,
    plan: list[PlannedTurn],
    since: float,
    timeout_s: float,
    schedule: list[tuple[int, str, str]] | None = None,
    extras: Extras | None = None,
) -> tuple[list[ChaosEvent], list[str]]:
    """Returns the chaos events and the problems (events that never happened, turns still
    open at the deadline)."""
    schedule = list(CHAOS) if schedule is None else schedule
    waves = WAVES if schedule == list(CHAOS) else len(schedule) + 1
    with ThreadPoolExecutor(max_workers=len(schedule)) as pool:
        driver = Driver(cluster, observer, since, pool, split_waves(plan, waves), schedule)
        driver.extras = extras
        conversations = len({p.conversation for p in plan})
        driver.enough_running = max(1, min(CHAOS_RUNNING, conversations // 4))
        progress_at = since
        while not driver.finished() and time.monotonic() - since < timeout_s:
            cluster.supervise(since)
            now = time.monotonic()
            if driver.wave_due(now):
                driver.submit_wave(now)
            elif driver.event_due(now):
                driver.run_event()
            else:
                if extras is not None:
                    extras.sample(observer)
                if now - progress_at >= 10:
                    print(f"  {now - since:6.1f} s  {observer.states()}", flush=True)
                    progress_at = now
                time.sleep(0.1)
        for event in driver.events:
            event.recovery_s()  # wait for the watchers
    problems = [f"chaos event never happened: {k} {n}" for _, k, n in driver.schedule]
    open_turns = len(plan) - observer.ended()
    if open_turns:
        problems.append(f"{open_turns} turns not ended (or not submitted) after {timeout_s:.0f} s")
    return driver.events, problems


# --- the run ---------------------------------------------------------------------------------


def soak_env(redis_url: str, seed: int, keys: Secrets, mixed_run: bool = False) -> dict[str, str]:
    return job_env(
        redis_url,
        AGENTS,
        **SETTINGS,
        **(mixed.SETTINGS if mixed_run else {}),
        **{sa.SEED_VARIABLE: str(seed)},
        OPENAI_API_KEY=keys.api_key,
        OPENAI_BASE_URL=keys.base_url,
    )


def configure_client(env: dict[str, str], redis_url: str) -> None:
    """This process is a client: same settings as the workers, none of their secrets."""
    os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS_URL"))})
    from tasks import app
    from tasks.queue.context import reset

    app.conf.update(broker_url=redis_url, result_backend=redis_url)
    reset()


def submit(plan: list[PlannedTurn]) -> list[tuple[str, str]]:
    """Each turn's task id and its conversation's namespace."""
    from tasks import run_turn
    from tasks.core.namespaces import namespace_for

    submitted = []
    for p in plan:
        kwargs: dict[str, Any] = {"agent": "soak", "conversation_id": p.conversation}
        kwargs["message"] = p.message
        if p.identity is not None:
            kwargs["identity"] = p.identity
        if p.hang:
            kwargs["deadline_s"] = mixed.HANG_DEADLINE_S
        task_id = run_turn.delay(**kwargs).id
        submitted.append((task_id, namespace_for(p.conversation, p.identity)))
    return submitted


def wait_for_results(task_ids: list[str]) -> None:
    from tasks import app

    waiting = set(task_ids)

    def all_ready() -> bool:
        waiting.difference_update({t for t in list(waiting) if app.AsyncResult(t).ready()})
        return not waiting

    try:
        wait_until(all_ready, RESULTS_TIMEOUT_S, "every Celery result", interval_s=0.5)
    except AssertionError:
        print(f"  {len(waiting)} Celery results still missing (the check reports them)")


@dataclass
class Outcome:
    findings: list[Finding]
    rows: list[tuple[str, str]]


def in_flight_by_round(
    events: list[ChaosEvent], number_of: dict[str, int]
) -> dict[tuple[int, int], list[str]]:
    allowed: dict[tuple[int, int], list[str]] = {}
    for event in events:
        for task_id, round_ in event.in_flight:
            allowed.setdefault((number_of[task_id], round_), []).append(event.label)
    return allowed


def examine(
    cluster: Cluster,
    observer: Observer,
    plan: list[PlannedTurn],
    events: list[ChaosEvent],
    extras: Extras | None = None,
) -> Outcome:
    from tasks import app, load_conversation
    from tasks.queue.context import job_context

    ctx = job_context()
    records = observer.records()
    submitted = plan[: len(observer.task_ids)]
    turns = [Turn(p, t, records[t]) for p, t in zip(submitted, observer.task_ids, strict=True)]
    logs = [p.log() for p in cluster.processes()]
    effects = checks.read_effects(ctx.redis, ctx.keys.prefix)
    starts = checks.read_starts(ctx.redis, ctx.keys.prefix)
    for turn in turns:
        events_key = ctx.keys.for_namespace(observer.namespaces[turn.task_id]).events(turn.task_id)
        finished = checks.finished_calls(ctx.redis, events_key, turn.plan.number)
        checks.mark_journaled(starts, finished)
    number_of = {t.task_id: t.plan.number for t in turns}
    entries = ctx.dead_letters.list_entries(bodies=True)
    result_texts: list[str] = []
    in_flight = in_flight_by_round(events, number_of)
    unsafe_in_flight = [key for key in in_flight if sa.is_unsafe_turn(key[0])]
    histories, unknown = checks.check_histories(turns, load_conversation, unsafe_in_flight)
    side_effects, repeats = checks.check_side_effects(turns, effects, in_flight, starts, unknown)
    for event in events:
        event.repeated = sum(
            1 for task_id, r in event.in_flight if effects.get((number_of[task_id], r), 0) > 1
        )
    cancelled = extras.canceller.cancelled if extras is not None else set()
    findings = [
        checks.check_outcomes(turns, logs, cancelled),
        checks.check_results(turns, app, result_texts),
        histories,
        side_effects,
        checks.check_dead_letters(turns, entries, ctx.settings.max_attempts),
        check_chaos(events),
        check_exits(cluster.exits),
    ]
    keys = Secrets(cluster.env["OPENAI_API_KEY"], cluster.env["OPENAI_BASE_URL"])
    findings.append(
        checks.check_secrets(keys.swept, ctx.redis, entries, result_texts, cluster.swept_files())
    )
    rows = table_rows(turns, events, repeats, len(unknown), len(cluster.exits), ctx)
    if extras is not None:
        findings += mixed_findings(extras, observer, ctx, rows)
        rows += mixed.latency_rows(turns)
    return Outcome(findings, rows)


def decided_counts(ctx: Any) -> str:
    raw = ctx.redis.hvals(sa.decisions_key(ctx.keys.prefix))
    counts: dict[str, int] = {}
    for value in raw:
        counts[value.decode()] = counts.get(value.decode(), 0) + 1
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "none"


def mixed_findings(
    extras: Extras, observer: Observer, ctx: Any, rows: list[tuple[str, str]]
) -> list[Finding]:
    """The mixed run's checks, and its figures added to `rows`."""
    budget, figures = mixed.check_budget(mixed.read_calls(ctx.redis, ctx.keys.prefix))

    def events_key(task_id: str) -> str:
        return ctx.keys.for_namespace(observer.namespaces[task_id]).events(task_id)

    answers = extras.canceller.answers
    rows += [
        *figures.items(),
        ("cancels asked / done", f"{len(answers)} / {len(extras.canceller.cancelled)}"),
        (
            "stream readers: turns followed / visits",
            f"{len(extras.readers.seen)} / {extras.readers.resumes}",
        ),
        (
            "bad requests refused",
            ", ".join(f"{k}: {n}" for k, n in sorted(extras.inputs.refused.items())),
        ),
        ("unreadable messages sent", str(extras.inputs.bad_messages_sent)),
        ("approvals decided by the decider process", decided_counts(ctx)),
        (
            "most running at once per tenant",
            ", ".join(f"{t}: {n}" for t, n in sorted(extras.caps.most.items())),
        ),
        ("Redis memory peak (sampled)", f"{extras.memory_peak / 2**20:.1f} MiB"),
    ]
    return [
        budget,
        mixed.check_caps(extras.caps),
        mixed.check_streams(extras.readers, ctx.redis, events_key),
        mixed.check_bad_inputs(extras.inputs, ctx),
    ]


def check_chaos(events: list[ChaosEvent]) -> Finding:
    finding = Finding("the chaos landed: each kill hit running turns, each recovered")
    for event in events:
        if event.label.startswith("kill") and not event.affected:
            finding.fail(f"{event.label} at {event.at_s:.1f} s hit no running turn")
        if event.affected and event.recovery_s() is None:
            finding.fail(f"{event.label}: turns not recovered within {RECOVERY_TIMEOUT_S:.0f} s")
    return finding


def check_exits(exits: list[Exit]) -> Finding:
    finding = Finding("no worker or pump exited on its own")
    for gone in exits:
        finding.fail(
            f"{gone.name} exited (code {gone.returncode}) at {gone.at_s:.1f} s: {gone.evidence}"
        )
    return finding


def table_rows(
    turns: list[Turn],
    events: list[ChaosEvent],
    repeats: checks.Repeats,
    unknown: int,
    exits: int,
    ctx: Any,
) -> list[tuple[str, str]]:
    states = [t.state for t in turns]
    reasons: dict[str, int] = {}
    for turn in turns:
        if turn.state == "dead_lettered":
            reasons[turn.field("reason")] = reasons.get(turn.field("reason"), 0) + 1
    kills = [e for e in events if e.label.startswith("kill")]
    delays = [e.recovery_s() for e in kills if e.affected]
    known = [d for d in delays if d is not None]
    worst = "never" if None in delays else (f"{max(known):.2f} s" if known else "n/a")
    prefix = ctx.keys.prefix
    faults = {k.decode(): int(v) for k, v in ctx.redis.hgetall(sa.faults_key(prefix)).items()}
    calls = sum(int(ctx.redis.get(sa.calls_key(prefix, t.plan.number)) or 0) for t in turns)
    after_return = str(repeats.after_return)
    rows = [
        ("turns", str(len(turns))),
        ("succeeded", str(states.count("succeeded"))),
        *((f"dead-lettered {reason}", str(n)) for reason, n in sorted(reasons.items())),
        ("resumes (sum of attempt-1)", str(sum(max(0, t.number("attempt") - 1) for t in turns))),
        ("kills", str(len(kills))),
        ("Redis restarts", str(sum(1 for e in events if e.label == "restart redis"))),
        ("deploys (SIGTERM hand-over)", str(sum(1 for e in events if e.label == "deploy"))),
        ("redeliveries", str(sum(t.number("redeliveries") for t in turns))),
        ("worst recovery delay", worst),
        ("repeated side effects", str(repeats.total)),
        ("  of calls that had completed (outcome journaled)", str(repeats.after_outcome)),
        ("  interrupted idempotent calls, again with their key", str(repeats.same_key)),
        ("  of unsafe calls", str(repeats.unsafe)),
        ("  killed after the tool returned, before its outcome was journaled", after_return),
        ("interrupted unsafe calls -> [outcome unknown]", str(unknown)),
        ("processes that exited on their own", str(exits)),
        ("model calls", str(calls)),
        ("faults injected", ", ".join(f"{k}: {v}" for k, v in sorted(faults.items()))),
    ]
    for event in events:
        delay = event.recovery_s()
        detail = f"{len(event.in_flight)} rounds in flight ({event.repeated} ran again)"
        if event.label.startswith("kill") or event.label == "deploy":
            detail += f", {event.affected} turns on it, recovered in " + (
                f"{delay:.2f} s" if delay is not None else "never" if event.affected else "n/a"
            )
        else:
            detail += f", down {event.down_s:.2f} s"
        rows.append((f"{event.label} at {event.at_s:.1f} s", detail))
    return rows


def report(outcome: Outcome, seed: int, wall_s: float) -> bool:
    print()
    width = max(len(label) for label, _ in outcome.rows)
    for label, value in [*outcome.rows, ("wall time", f"{wall_s:.1f} s"), ("seed", str(seed))]:
        print(f"  {label:<{width}}  {value}")
    print()
    passed = True
    for finding in outcome.findings:
        print(f"  {'PASS' if not finding.problems else 'FAIL'}  {finding.name}")
        for problem in finding.problems[:15]:
            print(f"          {problem}")
        if len(finding.problems) > 15:
            print(f"          ... and {len(finding.problems) - 15} more")
        passed = passed and not finding.problems
    return passed


def run(args: argparse.Namespace, workdir: Path) -> bool:
    started = time.monotonic()
    plan = make_plan(args.seed, args.turns, args.conversations, args.mixed)
    kind = "mixed soak" if args.mixed else "soak"
    print(f"{kind} seed {args.seed}: {args.turns} turns over {args.conversations} conversations")
    print(f"workdir {workdir}")
    server = RedisServer(workdir / "redis", appendonly=True).start()
    env = soak_env(server.url, args.seed, Secrets.fresh(), args.mixed)
    cluster = Cluster(server, env, workdir / "logs", with_decider=args.mixed)
    extras = Extras.for_seed(args.seed) if args.mixed else None
    schedule = mixed_chaos(args.seed, args.turns) if args.mixed else None
    try:
        configure_client(cluster.env, server.url)
        cluster.start()
        from tasks.queue.context import job_context

        observer = Observer(job_context().redis, job_context().keys, [])
        if extras is not None:
            extras.start()
        events, problems = drive(cluster, observer, plan, started, args.timeout_s, schedule, extras)
        ran_s = time.monotonic() - started
        if extras is not None:
            extras.stop()
        wait_for_results(observer.task_ids)
        dead = [p.name for p in cluster.shared() if not p.alive()]
        cluster.stop_decider()
        cluster.stop()
        outcome = examine(cluster, observer, plan, events, extras)
        outcome.findings.insert(0, Finding("the run finished", problems))
        outcome.findings.append(
            Finding("every shared process alive at the end", [f"{n} was not" for n in dead])
        )
        rate = f"{len(observer.task_ids) / ran_s:.1f} over {ran_s:.0f} s"
        outcome.rows.insert(1, ("turns per second (submission to the last end)", rate))
    finally:
        if extras is not None:
            extras.stop()
        cluster.stop()
        server.stop()
    return report(outcome, args.seed, time.monotonic() - started)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="everything at once (bench/soak_mixed.py): 10,000 turns of 3 tenants by default",
    )
    parser.add_argument("--turns", type=int, default=None, help="500; 10,000 mixed")
    parser.add_argument("--conversations", type=int, default=None, help="50; 1,000 mixed")
    parser.add_argument("--timeout-s", type=float, default=None, help="600 s; 3,600 s mixed")
    parser.add_argument("--workdir", type=Path, help="logs and Redis data (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir after a pass")
    args = parser.parse_args(argv)
    defaults = (10_000, 1_000, 3_600.0) if args.mixed else (500, 50, 600.0)
    for name, default in zip(("turns", "conversations", "timeout_s"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agentjobs-soak-"))
    passed = run(args, workdir)
    if passed and not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not passed:
        print(f"\nlogs and Redis data kept in {workdir}")
    print("\nsoak PASSED" if passed else "\nsoak FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
