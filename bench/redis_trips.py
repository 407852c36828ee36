"""Redis round trips and commands per turn: the job system against a bare Celery task, split by
process (the client that submits and waits, the worker) and by phase, on one private Redis:

  (a) bare Celery no-op task          bench.celery_noop's noop: noop.delay()
  (b) run_turn, an instant provider   run_turn.delay(agent="instant", ...)
  (c) run_turn, one tool round        run_turn.delay(agent="one_round", ...)

Each runs a batch of --turns turns after a warm-up, as bench/throughput.py does: every turn
submitted, then every result waited for; each turn its own conversation (so no turn wakes a
next one); no pump. The worker has the Procfile's flags (`--pool threads --loglevel INFO`) and
--concurrency threads: 1 by default, which makes the batch's edges exact (one BRPOP took the
first message, the last ack ends it, or where the worker writes no ack, the last task's end);
with more threads the BRPOP left waiting after the last message, and any that timed out, fall
in the batch too. The per-turn figures are otherwise the same (--concurrency 2 to see).

How it counts (it prints figures and asserts nothing):

- round trips, top-level commands and bytes sent, exactly, per process: redis-py's
  Connection.send_packed_command is wrapped. One call writes one request: one command, or a
  whole pipeline (MULTI ... EXEC counted as commands): one round trip. Its RESP is parsed for
  the commands in it. In this process (the client) the wrapper is installed at start, and
  the connections of MONITOR and INFO are left out. The worker is started as
  `celery -A bench.redis_trips:bare_app worker` (or `:ours_app`): names that install the same
  wrapper, logging to the file BENCH_COUNT_TRIPS names, and hand Celery the app of
  bench.celery_noop or of tasks (the Procfile's `-A tasks`) as it is.
- commands run inside scripts: Redis MONITOR, whose 'lua' lines follow the EVALSHA that ran
  them (Redis 7): their mean per call of each script, times the calls counted above. An
  EVALSHA is named by its SHA: the SHA1 of each script's text as TurnRecords loads it
  (tasks.store.records._source), kombu's and redis-py's own scripts. At the end MONITOR's
  top-level lines of each process, over the whole run, are checked against the wrappers'.
- bytes to Redis per turn: INFO stats total_net_input_bytes over the batch / N (both
  processes, and whatever else they sent meanwhile); per phase, what the wrappers sent.

Phases, from what each request says and, in a task thread, what came before it there since the
task started (task_prerun): client: submit (the register script, kombu's publish: LPUSH), result
(SUBSCRIBE, GET of the result, UNSUBSCRIBE); worker: receive (BRPOP and kombu's unacked
bookkeeping, which our worker leaves out for a turn's message: tasks/queue/broker.py), claim
(the claim script, and what a task thread sends before it), run (the task thread's other
scripts: progress, journal, the streamed tokens, trace; and whatever else before the turn
ends), succeed (the script that ends the turn, Celery's result writes), ack (the unacked
bookkeeping undone). Requests of the worker's other threads (its beat, the lease keeper,
kombu's binding and restore timers) and of opening a connection (HELLO, CLIENT SETINFO) are
listed as background, over the batch, not per turn.

    .venv/bin/python bench/redis_trips.py [--turns 50] [--concurrency 1] [--sequence]
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "BENCH_COUNT_TRIPS"

# -- the wrapper, in this process and in the worker ---------------------------------------------

# One request: (time.time(), thread name, local port, bytes, [[NAME, arg1, arg2, arg3], ...]).
Send = tuple[float, str, int, int, list[list[str]]]
_ARG_CHARS = 80


def commands_of(data: bytes) -> list[list[str]]:
    """The commands of a request as sent (RESP arrays of bulk strings): each one's name in
    upper case and its first three arguments, shortened."""
    commands: list[list[str]] = []
    i, end = 0, len(data)
    while i < end and data[i : i + 1] == b"*":
        j = data.index(b"\r\n", i)
        count, i = int(data[i + 1 : j]), j + 2
        parts: list[str] = []
        for n in range(count):
            j = data.index(b"\r\n", i)
            length, i = int(data[i + 1 : j]), j + 2
            if n < 4:
                parts.append(data[i : i + min(length, _ARG_CHARS)].decode("utf-8", "replace"))
            i += length + 2
        if parts:
            parts[0] = parts[0].upper()
            commands.append(parts)
    return commands


class TripLog:
    """Every request this process's redis-py connections send, as Send tuples."""

    def __init__(self) -> None:
        self.sends: list[Send] = []
        self._lock = threading.Lock()

    def record(self, connection: Any, command: Any) -> None:
        if getattr(connection, "_bench_uncounted", False):
            return
        items = [command] if isinstance(command, str | bytes | memoryview) else command
        data = b"".join(i.encode() if isinstance(i, str) else bytes(i) for i in items)
        sock = connection._sock
        port = int(sock.getsockname()[1]) if sock is not None else 0
        self.add((time.time(), threading.current_thread().name, port, len(data), commands_of(data)))

    def add(self, send: Send) -> None:
        with self._lock:
            self.sends.append(send)

    def snapshot(self) -> list[Send]:
        with self._lock:
            return list(self.sends)

    def take(self) -> list[Send]:
        with self._lock:
            taken, self.sends = self.sends, []
        return taken


LOG = TripLog()
_installed: list[bool] = []


def install_counter() -> TripLog:
    """Wrap redis-py's send_packed_command (once) so that each request is recorded in LOG."""
    if not _installed:
        _installed.append(True)
        connection_class = redis.connection.AbstractConnection
        original = connection_class.send_packed_command

        def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            original(self, command, check_health)
            LOG.record(self, command)

        connection_class.send_packed_command = send_packed_command  # type: ignore[method-assign]
    return LOG


def _log_to_file(path: str) -> None:
    """In the worker: append LOG's requests to `path` as JSON lines, every 50 ms and at exit."""
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
    lock = threading.Lock()

    def flush() -> None:
        with lock:
            for send in LOG.take():
                out.write(json.dumps(send) + "\n")
            out.flush()

    def loop() -> None:
        while True:
            time.sleep(0.05)
            flush()

    threading.Thread(target=loop, name="bench-trips", daemon=True).start()
    atexit.register(flush)


MARK_TASK = "#task"  # a pseudo request: a task starts in this thread (task_prerun)
MARK_DONE = "#done"  # ... and ends (task_postrun)
MARKS = (MARK_TASK, MARK_DONE)


def _counted_worker() -> None:
    path = os.environ.get(ENV_VAR)
    if path and not _installed:
        from celery.signals import task_postrun, task_prerun

        install_counter()
        _log_to_file(path)

        def task_starts(**_: Any) -> None:
            LOG.add((time.time(), threading.current_thread().name, 0, 0, [[MARK_TASK]]))

        def task_ends(**_: Any) -> None:
            LOG.add((time.time(), threading.current_thread().name, 0, 0, [[MARK_DONE]]))

        task_prerun.connect(task_starts, weak=False)
        task_postrun.connect(task_ends, weak=False)


def __getattr__(name: str) -> Any:
    # `celery -A bench.redis_trips:bare_app` / `:ours_app`: the app of bench.celery_noop or of
    # tasks, in a worker whose requests are counted.
    if name == "bare_app":
        _counted_worker()
        from bench.celery_noop import app as bare

        return bare
    if name == "ours_app":
        _counted_worker()
        from tasks import app as ours

        return ours
    raise AttributeError(name)


# -- scripts and phases -------------------------------------------------------------------------

CLIENT, WORKER = "client", "worker"
PHASES = {CLIENT: ["submit", "result"], WORKER: ["receive", "claim", "run", "succeed", "ack"]}
BACKGROUND = "background"
CONNECTING = {"HELLO", "CLIENT", "SELECT", "AUTH", "READONLY"}
ENDING_SCRIPTS = {"succeed", "dead_letter", "retry", "pause", "handover", "cancel"}
RESULT_KEY = "celery-task-meta-"


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def script_names() -> dict[str, str]:
    """{SHA1: name} of the scripts there are: tasks/store/lua/'s as TurnRecords loads them,
    kombu's Redis transport's and redis-py's lock's."""
    import kombu.transport.redis as kombu_redis
    from redis.lock import Lock

    from tasks.core.schema import SCRIPTS
    from tasks.store.records import _source

    names = {sha1(_source(name)): name for name in SCRIPTS}
    for attribute in ("REFRESH_BINDING", "SWEEP_BINDINGS"):
        text = getattr(kombu_redis, attribute, None)
        if isinstance(text, str):
            names[sha1(text)] = f"kombu:{attribute.lower()}"
    for attribute in ("LUA_RELEASE_SCRIPT", "LUA_EXTEND_SCRIPT", "LUA_REACQUIRE_SCRIPT"):
        names[sha1(getattr(Lock, attribute))] = f"lock:{attribute.split('_')[1].lower()}"
    return names


def label(command: list[str], scripts: dict[str, str]) -> str:
    """A command's name; an EVALSHA's with its script's."""
    if command[0] == "EVALSHA" and len(command) > 1:
        return f"EVALSHA {scripts.get(command[1], command[1][:8])}"
    return command[0]


def _unacked(commands: list[list[str]], name: str) -> bool:
    return any(c[0] == name and len(c) > 1 and c[1].endswith("unacked_index") for c in commands)


def acks(sends: Iterable[Send]) -> list[float]:
    return [s[0] for s in sends if _unacked(s[4], "ZREM")]


def task_ends(sends: list[Send], after: float) -> list[float]:
    """When the worker was done with each task since `after`: its ack, where the worker writes
    one (kombu's unacked record undone); else the task's end (a turn's message, held in the
    worker's memory only, is acknowledged there)."""
    acked = [t for t in acks(sends) if t >= after]
    if acked:
        return acked
    return [s[0] for s in sends if s[4] and s[4][0][0] == MARK_DONE and s[0] >= after]


class Classifier:
    """The phase of each request; a task thread's by the scripts it sent before."""

    def __init__(self, scripts: dict[str, str]) -> None:
        self.scripts = scripts
        self.thread_phase: dict[str, str] = {}

    def phase(self, process: str, send: Send) -> str:
        _, thread, _, _, commands = send
        names = [c[0] for c in commands]
        if not names or names[0] in CONNECTING:
            return BACKGROUND
        if process == CLIENT:
            if names[0] in ("SUBSCRIBE", "UNSUBSCRIBE", "PING") or (
                names[0] in ("GET", "MGET") and RESULT_KEY in commands[0][-1]
            ):
                return "result"
            return "submit"
        if names[0] == "BRPOP" or _unacked(commands, "ZADD"):
            return "receive"
        if _unacked(commands, "ZREM"):
            return "ack"
        if names[0] == MARK_TASK:
            self.thread_phase[thread] = "claim"
            return MARK_TASK
        if names[0] == MARK_DONE:
            return MARK_DONE
        if not thread.startswith("ThreadPoolExecutor"):
            return BACKGROUND
        now = self.thread_phase.get(thread, "claim")
        script = self.scripts.get(commands[0][1], "") if names[0] == "EVALSHA" else ""
        if script == "claim":
            self.thread_phase[thread] = "run"
            return "claim"
        if script in ENDING_SCRIPTS:
            self.thread_phase[thread] = "succeed"
            return "succeed"
        if script:
            return "run"  # progress, journal, tokens, trace: the turn's own writes
        if now == "claim" and any(RESULT_KEY in c[1] for c in commands if len(c) > 1):
            # A bare task's result writes: it has no claim.
            self.thread_phase[thread] = "succeed"
            return "succeed"
        return now


# -- MONITOR -----------------------------------------------------------------------------------


class Monitor:
    """Redis MONITOR in a thread: every line until stop()."""

    MARK = "bench-redis-trips-stop"

    def __init__(self, url: str) -> None:
        self.lines: list[dict[str, Any]] = []
        self._monitor = redis.Redis.from_url(url).monitor().__enter__()
        self._monitor.connection._bench_uncounted = True
        self._thread = threading.Thread(target=self._listen, name="bench-monitor", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            for line in self._monitor.listen():
                if line["command"] == f"ECHO {self.MARK}":
                    return
                self.lines.append(line)
        except redis.ConnectionError:
            return  # the server stopped

    def stop(self, control: redis.Redis) -> None:
        control.echo(self.MARK)
        self._thread.join(10)


@dataclass
class ScriptCost:
    """What scripts ran inside, from MONITOR: per script, its calls and inner commands."""

    calls: Counter[str] = field(default_factory=Counter)
    inner: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def per_call(self, script: str) -> dict[str, float]:
        calls = self.calls.get(script, 0)
        return {name: n / calls for name, n in self.inner[script].items()} if calls else {}


def script_costs(lines: Iterable[dict[str, Any]], scripts: dict[str, str]) -> ScriptCost:
    cost = ScriptCost()
    current = ""
    for line in lines:
        words = line["command"].split(" ", 2)
        if line["client_type"] == "lua":
            if current:
                cost.inner[current][words[0].upper()] += 1
            continue
        current = ""
        if words[0].upper() == "EVALSHA" and len(words) > 1:
            current = scripts.get(words[1], words[1][:8])
            cost.calls[current] += 1
    return cost


# -- one batch ---------------------------------------------------------------------------------


@dataclass
class Batch:
    title: str
    turns: int
    client: list[Send]
    worker: list[Send]
    seconds: float
    bytes_in: int  # INFO total_net_input_bytes over the batch
    window: tuple[float, float]  # from the first request of either process to the last
    turn_id: str  # the middle turn's, for --sequence


def read_log(path: Path) -> list[Send]:
    if not path.exists():
        return []
    sends: list[Send] = []
    for raw in path.read_text().splitlines():
        try:
            t, thread, port, size, commands = json.loads(raw)
        except ValueError:
            continue  # a line being written
        sends.append((t, thread, port, size, commands))
    return sends


def wait_for_acks(path: Path, count: int, after: float, timeout_s: float = 60) -> list[Send]:
    """The worker's log once it shows `count` acks sent after `after`."""
    deadline = time.monotonic() + timeout_s
    while True:
        sends = read_log(path)
        if len(task_ends(sends, after)) >= count or time.monotonic() > deadline:
            return sends
        time.sleep(0.05)


def run_batch(
    title: str,
    submit: Callable[[int], Any],
    turns: int,
    warm_up: int,
    worker_log: Path,
    control: redis.Redis,
) -> Batch:
    started_warm_up = time.time()
    for result in [submit(-1 - i) for i in range(warm_up)]:
        result.get(timeout=60)
    wait_for_acks(worker_log, warm_up, started_warm_up)
    time.sleep(0.2)
    bytes_before = int(control.info("stats")["total_net_input_bytes"])
    t0 = time.time()
    results = [submit(i) for i in range(turns)]
    for result in results:
        result.get(timeout=120)
    t1 = time.time()
    client = [s for s in LOG.snapshot() if t0 <= s[0] <= t1]
    sends = wait_for_acks(worker_log, turns, t0)
    bytes_after = int(control.info("stats")["total_net_input_bytes"])
    # The worker's batch: from the BRPOP that took the first message (sent while it waited,
    # before t0) to the batch's last ack.
    brpops = [s[0] for s in sends if s[4] and s[4][0][0] == "BRPOP" and s[0] <= t0]
    start = max(brpops, default=t0)
    end = sorted(task_ends(sends, t0))[turns - 1]
    worker = [s for s in sends if start <= s[0] <= end]
    return Batch(
        title,
        turns,
        client,
        worker,
        t1 - t0,
        bytes_after - bytes_before,
        (start, max(end, t1)),
        str(results[turns // 2].id),
    )


# -- report ------------------------------------------------------------------------------------


def number(value: float) -> str:
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def listing(counts: Counter[str] | dict[str, float], per: float) -> str:
    return ", ".join(f"{name} {number(n / per)}" for name, n in counts.items() if n)


@dataclass
class Row:
    trips: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    inner: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # in scripts
    sent: int = 0

    def add(self, send: Send, labels: list[str], inner: dict[str, float]) -> None:
        self.trips += 1
        self.commands.update(labels)
        for name, n in inner.items():
            self.inner[name] += n
        self.sent += send[3]

    def merge(self, other: Row) -> None:
        self.trips += other.trips
        self.commands.update(other.commands)
        for name, n in other.inner.items():
            self.inner[name] += n
        self.sent += other.sent

    def figures(self, turns: int) -> str:
        per_turn = [
            self.trips / turns,
            sum(self.commands.values()) / turns,
            sum(self.inner.values()) / turns,
        ]
        shown = "".join(f"{number(value):>7}" for value in per_turn)
        return f"{shown}{self.sent / turns:>7.0f}"


def report(batch: Batch, lines: list[dict[str, Any]], scripts: dict[str, str], seq: bool) -> None:
    start, end = batch.window
    costs = script_costs((ln for ln in lines if start <= ln["time"] <= end + 0.05), scripts)
    classifier = Classifier(scripts)
    rows: dict[tuple[str, str], Row] = defaultdict(Row)
    order: dict[str, list[tuple[str, Send, list[str]]]] = {CLIENT: [], WORKER: []}
    for process, sends in ((CLIENT, batch.client), (WORKER, batch.worker)):
        for send in sends:
            phase = classifier.phase(process, send)
            if phase == MARK_DONE:
                order[process].append((phase, send, []))
            if phase in MARKS:
                continue
            labels = [label(c, scripts) for c in send[4]]
            inner: dict[str, float] = defaultdict(float)
            for name in labels:
                if name.startswith("EVALSHA "):
                    for command, n in costs.per_call(name.split(" ", 1)[1]).items():
                        inner[command] += n
            rows[process, phase].add(send, labels, inner)
            order[process].append((phase, send, labels))
    n = batch.turns
    print(f"{batch.title}: {n} turns in {batch.seconds:.2f} s")
    print(f"  {'':16} {'trips':>6} {'cmds':>6} {'in lua':>6} {'bytes':>6}  commands per turn")
    totals = {process: Row() for process in PHASES}
    for process, phases in PHASES.items():
        for phase in phases:
            row = rows.get((process, phase))
            if row is None:
                continue
            totals[process].merge(row)
            print(f"  {process:7} {phase:8}{row.figures(n)}  {listing(row.commands, n)}")
            if row.inner:
                print(f"  {'':44}in scripts: {listing(row.inner, n)}")
    both = Row()
    for process, total in totals.items():
        both.merge(total)
        print(f"  {process:7} {'total':8}{total.figures(n)}")
    print(f"  {'both':7} {'total':8}{both.figures(n)}")
    print(f"  bytes to Redis per turn, INFO total_net_input_bytes / {n}: {batch.bytes_in / n:.0f}")
    for process in PHASES:
        row = rows.get((process, BACKGROUND))
        if row is not None:
            print(
                f"  {process} background in the batch (not per turn): {row.trips} trips: "
                f"{listing(row.commands, 1)}"
            )
    if seq:
        show_sequence(batch, order)
    print()


def show_sequence(batch: Batch, order: dict[str, list[tuple[str, Send, list[str]]]]) -> None:
    """The requests of the batch's middle turn: the client's that name its id, and the first
    LPUSH after the first of them (its publish); the worker's from the BRPOP that received it
    to its ack."""
    print(f"  the requests of turn {batch.turn_id}, in order:")
    seen, published = False, False
    for phase, send, labels in order[CLIENT]:
        mine = any(batch.turn_id in arg for c in send[4] for arg in c[1:])
        publish = seen and not published and labels == ["LPUSH"]
        if mine or publish:
            print(f"    client  {phase:8} {' '.join(labels)}")
        seen, published = seen or mine, published or publish
    worker = order[WORKER]
    claimed = next(
        (i for i, (_, s, _) in enumerate(worker) if any(batch.turn_id in a for a in s[4][0])),
        None,
    )
    if claimed is None:  # a bare task: the middle one
        claimed = len(worker) // 2
    first = max(
        (i for i in range(claimed + 1) if worker[i][2] == ["BRPOP"]),
        default=0,
    )
    acked = any(phase == "ack" for phase, _, _ in worker)
    for phase, send, labels in worker[first:]:
        if phase == MARK_DONE:
            if acked:
                continue
            break  # no ack follows: the worker holds its turns' messages in memory only
        print(f"    worker  {phase:8} {' '.join(labels)}    ({send[1]})")
        if phase == "ack":
            break


def check(lines: list[dict[str, Any]], processes: dict[str, list[Send]], skipped: set[int]) -> None:
    """MONITOR's top-level lines against the wrappers' commands, over the whole run."""
    by_port: dict[int, Counter[str]] = defaultdict(Counter)
    for line in lines:
        if line["client_type"] != "lua" and line["client_port"]:
            by_port[int(line["client_port"])][line["command"].split(" ", 1)[0].upper()] += 1
    shown = []
    for name, sends in processes.items():
        wrapped = Counter(c[0] for s in sends for c in s[4] if c[0] not in MARKS)
        seen: Counter[str] = Counter()
        for port in {s[2] for s in sends} - skipped:
            seen.update(by_port.get(port, Counter()))
        hidden = wrapped.pop("CLIENT", 0)  # MONITOR leaves CLIENT (SETINFO) out
        differ = (wrapped - seen) + (seen - wrapped)
        detail = f", differ: {listing(differ, 1)}" if differ else ""
        shown.append(f"{name} {wrapped.total()} / {seen.total()} (+{hidden} CLIENT{detail})")
    print("check, top-level commands over the whole run, wrappers / MONITOR: " + "; ".join(shown))


# -- main --------------------------------------------------------------------------------------

AGENTS = {
    "instant": "bench.agents:build_instant_agent",
    "one_round": "bench.agents:build_one_round_agent",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--turns", type=int, default=50, help="turns a batch (default 50)")
    parser.add_argument("--warm-up", type=int, default=20, help="turns before each batch")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help=f"worker threads (default 1; the Procfile's, Celery's default: {os.cpu_count()})",
    )
    parser.add_argument(
        "--sequence", action="store_true", help="also show one turn's requests in order"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tasks.testing import RedisServer, job_env, start_worker

    batches: list[Batch] = []
    worker_sends: dict[str, list[Send]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        logs = Path(tmp) / "logs"
        env = job_env(server.url, AGENTS)
        # This process is the client of both apps.
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AGENTJOBS_", "REDIS"))})
        control = redis.Redis.from_url(server.url, single_connection_client=True)
        control.ping()
        control.connection._bench_uncounted = True  # type: ignore[union-attr]
        monitor = Monitor(server.url)
        install_counter()
        scripts = script_names()
        print(
            f"threads pool, concurrency {args.concurrency}, loglevel INFO; batches of "
            f"{args.turns} turns, each after {args.warm_up} to warm up; no pump"
        )
        print()

        def counted_worker(name: str, app: str) -> tuple[Any, Path]:
            log = Path(tmp) / f"{name}.trips"
            process = start_worker(
                {**env, ENV_VAR: str(log)},
                logs,
                name=name,
                app=f"bench.redis_trips:{app}",
                concurrency=args.concurrency,
            )
            return process, log

        try:
            from bench.celery_noop import noop

            worker, log = counted_worker("bare", "bare_app")
            try:
                batches.append(
                    run_batch(
                        "(a) bare Celery no-op task",
                        lambda i: noop.delay(),
                        args.turns,
                        args.warm_up,
                        log,
                        control,
                    )
                )
            finally:
                worker.stop()
            worker_sends["bare worker"] = read_log(log)

            from tasks import run_turn

            worker, log = counted_worker("ours", "ours_app")
            try:
                for title, agent in (
                    ("(b) run_turn, instant provider", "instant"),
                    ("(c) run_turn, one tool round", "one_round"),
                ):
                    batches.append(
                        run_batch(
                            title,
                            lambda i, agent=agent: run_turn.delay(
                                agent=agent, conversation_id=f"{agent}{i}", message="hi"
                            ),
                            args.turns,
                            args.warm_up,
                            log,
                            control,
                        )
                    )
            finally:
                worker.stop()
            worker_sends["our worker"] = read_log(log)
            monitor.stop(control)
        finally:
            server.stop()
    for batch in batches:
        report(batch, monitor.lines, scripts, args.sequence)
    # A port seen by two processes (a closed connection's, used again) is left out.
    ports = [{s[2] for s in sends} for sends in [LOG.snapshot(), *worker_sends.values()]]
    skipped = {p for i, a in enumerate(ports) for b in ports[i + 1 :] for p in a & b}
    check(monitor.lines, {"client": LOG.snapshot(), **worker_sends}, skipped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
