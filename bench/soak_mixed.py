"""The mixed soak's extra actors and checks (bench/soak.py --mixed): everything at once on top
of the chaos soak's kills and restarts.

- tenants: three, acme flooding (six turns in ten), beta and gamma; each conversation is one
  tenant's, and its turns carry that identity;
- a shared budget on the soak gateway (requests and tokens per 5 s window) and tenant running
  caps (which turn the fairness gate on), checked from the gateway's own log of calls and from
  samples of the running turns per tenant;
- a canceller that cancels 1% of the turns at a random moment of their life;
- hung tools: a few turns whose tool hangs past their deadline, ended deadline_exceeded, and a
  few whose tool outlasts its tool timeout (the model reads `[timed out] ...` and goes on);
- approvals: 2% of the turns pause for a person, decided by a process of its own
  (bench/soak_decider.py): approved, rejected, or left to expire (pause_expired);
- stream readers that follow random turns, drop the stream after a few events and resume
  after the last one they saw, through kills and Redis restarts;
- a trickle of bad requests with every wave (a turn id of another tenant's turn, a bad id, a
  bad deadline, a message that is not text) and of unreadable messages on the turn queue.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from bench import soak_agent as sa
from bench.soak_checks import Finding, PlannedTurn

TENANTS = (("acme", 6), ("beta", 3), ("gamma", 1))  # (tenant, share in ten conversations)
CANCEL_SHARE = 0.01
HANG_SHARE = 0.003
PAUSE_SHARE = 0.02
SLOW_SHARE = 0.005
PAUSE_TTL_S = 6
HANG_DEADLINE_S = 4.0
BUDGET_WINDOW_S = 5
BUDGET_REQUESTS = 600
BUDGET_TOKENS = 150_000
TENANT_CAPS = {"acme": 14, "*": 10}
STREAM_READERS = 4
BAD_REQUESTS_PER_WAVE = 4
BAD_MESSAGES_PER_WAVE = 1

SETTINGS = {
    "AGENTJOBS_BUDGETS": (
        f"soak-gateway:*=requests:{BUDGET_REQUESTS}/{BUDGET_WINDOW_S}s,"
        f"tokens:{BUDGET_TOKENS}/{BUDGET_WINDOW_S}s"
    ),
    "AGENTJOBS_BUDGET_OUTPUT_TOKENS": "16",
    "AGENTJOBS_TENANT_MAX_RUNNING": ",".join(f"{t}={n}" for t, n in TENANT_CAPS.items()),
    "AGENTJOBS_PAUSE_TTL_S": str(PAUSE_TTL_S),
    # Every 429 closes the shared budget for its retry-after: a short one, or 5% of the calls
    # would hold the whole run.
    sa.RETRY_AFTER_VARIABLE: "0.1",
}


def tenant_of(conversation_index: int) -> str:
    slot = conversation_index % 10
    for tenant, share in TENANTS:
        if slot < share:
            return tenant
        slot -= share
    raise AssertionError("the shares add up to ten")


def mixed_plan(rng: random.Random, plan: list[PlannedTurn], seed: int) -> list[PlannedTurn]:
    """The chaos soak's plan with tenants, the turns to cancel, the hung ones and those that
    pause for the decider (never an unsafe turn's: their rounds must not repeat anyway)."""
    picks = rng.sample(range(len(plan)), max(2, round(len(plan) * (CANCEL_SHARE + HANG_SHARE))))
    hung = set(picks[: max(1, round(len(plan) * HANG_SHARE))])
    cancel = set(picks) - hung
    others = [p.number for p in plan if p.number not in hung | cancel and not p.refused]
    safe = [n for n in others if not sa.is_unsafe_turn(n)]
    pausing = set(rng.sample(safe, max(3, round(len(plan) * PAUSE_SHARE))))
    rest = [n for n in safe if n not in pausing]
    slow = set(rng.sample(rest, max(2, round(len(plan) * SLOW_SHARE))))
    mixed = []
    for p in plan:
        index = int(p.conversation.removeprefix("c"))
        tenant = tenant_of(index)
        refused = p.refused and p.number not in hung
        mixed.append(
            PlannedTurn(
                p.number,
                f"{tenant}-{p.conversation}",
                p.rounds,
                refused,
                tenant=tenant,
                cancel=p.number in cancel,
                hang=p.number in hung,
                decision=sa.decision_for(seed, p.number) if p.number in pausing else "",
                slow=p.number in slow,
            )
        )
    return mixed


def patient(call: Any, *args: Any, **kwargs: Any) -> Any:
    return sa.patiently(lambda: call(*args, **kwargs))


# --- the canceller ---------------------------------------------------------------------------


@dataclass
class Canceller:
    """Cancels each planned turn at a random moment after its submission (0-4 s: queued,
    running or waiting, whatever it is then); cancel_turn's answer says whether it did."""

    seed: int
    due: list[tuple[float, str]] = field(default_factory=list)
    answers: dict[str, bool] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def add(self, submitted: list[tuple[PlannedTurn, str]]) -> None:
        now = time.monotonic()
        with self.lock:
            for plan, task_id in submitted:
                if plan.cancel:
                    delay = sa.unit_hash(self.seed, plan.number, "cancel") * 4.0
                    self.due.append((now + delay, task_id))

    def run(self) -> None:
        from tasks import cancel_turn

        while not self.stop.is_set():
            now = time.monotonic()
            with self.lock:
                ready = [t for at, t in self.due if at <= now]
                self.due = [(at, t) for at, t in self.due if at > now]
            for task_id in ready:
                self.answers[task_id] = bool(
                    patient(cancel_turn, task_id, reason="the soak's canceller")
                )
            time.sleep(0.05)

    @property
    def cancelled(self) -> set[str]:
        return {t for t, yes in self.answers.items() if yes}


# --- stream readers --------------------------------------------------------------------------


@dataclass
class StreamReaders:
    """Readers that each follow one random submitted turn at a time, leave after 1-5 events
    and come back after the last event they saw, until its terminal event."""

    seed: int
    candidates: list[str] = field(default_factory=list)
    seen: dict[str, list[str]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)  # followed to their terminal event
    resumes: int = 0
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, task_ids: list[str]) -> None:
        with self.lock:
            self.candidates.extend(task_ids)

    def run(self, index: int) -> None:
        rng = random.Random(self.seed * 100 + index)
        while not self.stop.is_set():
            with self.lock:
                choices = [t for t in self.candidates if t not in self.seen]
            if not choices:
                time.sleep(0.2)
                continue
            turn_id = rng.choice(choices)
            got: list[str] = []
            self.seen[turn_id] = got
            if self._follow(turn_id, got, rng):
                self.finished.add(turn_id)

    def _follow(self, turn_id: str, got: list[str], rng: random.Random) -> bool:
        """Read the turn's events in visits of 1-5; True once its terminal event was read."""
        from tasks import iter_events
        from tasks.core.schema import TERMINAL_EVENTS

        unknown = 0
        while not self.stop.is_set():
            budget = rng.randint(1, 5)
            try:
                for event in iter_events(turn_id, after=got[-1] if got else None, block_s=2.0):
                    got.append(event.id)
                    if event.type in TERMINAL_EVENTS:
                        return True
                    budget -= 1
                    if budget == 0:
                        break  # the reader goes away, and comes back
            except (redis.ConnectionError, redis.TimeoutError):
                self.errors += 1
                time.sleep(0.2)
            except LookupError:  # not registered yet, or gone: give up after a few tries
                unknown += 1
                if unknown > 10:
                    return False
                time.sleep(0.2)
            self.resumes += 1
        return False


def check_streams(readers: StreamReaders, client: redis.Redis, events_key: Any) -> Finding:
    """Each reader saw every event of its turn once, in order (the stream's own ids)."""
    finding = Finding("every stream reader saw every event once, in order, across resumes")
    for turn_id, got in readers.seen.items():
        stored = [
            entry_id.decode()
            for entry_id, fields in client.xrange(events_key(turn_id))  # type: ignore[union-attr]
            if fields.get(b"type") != b"token.delta"
        ]
        whole = turn_id in readers.finished
        if got != stored[: len(got)] or (whole and len(got) != len(stored)):
            finding.fail(f"turn {turn_id}: read {len(got)} events {got[:6]}, stream {stored[:6]}")
    if not readers.seen:
        finding.fail("no reader followed any turn")
    return finding


# --- bad requests and unreadable messages ----------------------------------------------------


@dataclass
class BadInputs:
    refused: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    # (task id, the tenant it belongs to): ids another tenant tried to reuse.
    reused: list[tuple[str, str]] = field(default_factory=list)
    bad_messages_sent: int = 0

    def trickle(self, rng: random.Random, owned: list[tuple[PlannedTurn, str]]) -> None:
        from tasks import InvalidTurnRequest, run_turn

        attempts: list[tuple[str, dict[str, Any], str | None]] = []
        if owned:
            plan, task_id = rng.choice(owned)
            other = next(t for t, _ in TENANTS if t != plan.tenant)
            kwargs = {"agent": "soak", "conversation_id": "c-thief", "message": "mine now"}
            attempts.append(("reused id", {**kwargs, "identity": {"tenant": other}}, task_id))
            self.reused.append((task_id, plan.tenant))
        base = {"agent": "soak", "conversation_id": "c-bad", "message": "hi"}
        attempts += [
            ("bad id", base, "not an id\n"),
            ("bad deadline", {**base, "deadline_s": math.nan}, None),
            ("message not text", {**base, "message": {"text": math.inf}}, None),
        ]
        for what, kwargs, task_id in attempts[:BAD_REQUESTS_PER_WAVE]:
            try:
                sa.patiently(lambda k=kwargs, t=task_id: run_turn.apply_async(kwargs=k, task_id=t))
            except InvalidTurnRequest:
                self.refused[what] += 1
            except Exception as exc:  # the check says what else came
                self.problems.append(f"{what}: {type(exc).__name__}: {exc}")
            else:
                self.problems.append(f"{what} was accepted")
        for _ in range(BAD_MESSAGES_PER_WAVE):
            sa.patiently(publish_garbage)
            self.bad_messages_sent += 1


def publish_garbage() -> None:
    """A message on the turn queue that no worker can read: a body that is not JSON."""
    from tasks import app
    from tasks.queue.context import job_context

    queue = job_context().settings.turn_queue
    with app.producer_or_acquire() as producer:
        producer.publish(
            b"\x00{not json",
            routing_key=queue,
            exchange=queue,
            content_type="application/json",
            content_encoding="binary",
            headers={
                "lang": "py",
                "task": "tasks.run_turn",
                "id": f"garbage-{time.monotonic_ns()}",
            },
        )


def check_bad_inputs(inputs: BadInputs, ctx: Any) -> Finding:
    from tasks.core.namespaces import owner_of_namespace
    from tasks.operate.metrics import bad_messages

    finding = Finding("bad requests refused by name, owners untouched, bad messages dropped")
    finding.problems += inputs.problems
    if not inputs.refused:
        finding.fail("no bad request was tried")
    for task_id, tenant in inputs.reused:
        record = ctx.records.find(task_id)
        if record is None or owner_of_namespace(record.namespace)[0] != tenant:
            finding.fail(f"turn {task_id} of {tenant} changed hands after a reuse")
    dropped = bad_messages(ctx)
    if dropped < inputs.bad_messages_sent:
        finding.fail(f"{inputs.bad_messages_sent} unreadable messages sent, {dropped} dropped")
    return finding


# --- budget and caps -------------------------------------------------------------------------


def busiest_windows(log: list[tuple[int, int]], window_ms: int) -> tuple[int, int]:
    """The most requests and the most tokens any span of `window_ms` of the log holds."""
    times = sorted(log)
    most_requests = most_tokens = tokens = start = 0
    for end in range(len(times)):
        tokens += times[end][1]
        while times[end][0] - times[start][0] >= window_ms:
            tokens -= times[start][1]
            start += 1
        most_requests = max(most_requests, end - start + 1)
        most_tokens = max(most_tokens, tokens)
    return most_requests, most_tokens


def read_calls(client: redis.Redis, prefix: str) -> list[tuple[int, int]]:
    raw: Any = client.lrange(sa.calls_log_key(prefix), 0, -1)
    return [tuple(orjson.loads(r)) for r in raw]  # type: ignore[misc]


def check_budget(calls: list[tuple[int, int]]) -> tuple[Finding, dict[str, str]]:
    finding = Finding("no budget window over its limit (the gateway's own log)")
    requests, tokens = busiest_windows(calls, BUDGET_WINDOW_S * 1000)
    if requests > BUDGET_REQUESTS:
        finding.fail(f"{requests} requests in {BUDGET_WINDOW_S} s (limit {BUDGET_REQUESTS})")
    if tokens > BUDGET_TOKENS:
        finding.fail(f"{tokens} tokens in {BUDGET_WINDOW_S} s (limit {BUDGET_TOKENS})")
    busy_s = (max(c[0] for c in calls) - min(c[0] for c in calls)) / 1000 if calls else 0
    windows = max(1.0, busy_s / BUDGET_WINDOW_S)
    spent = sum(c[1] for c in calls)
    figures = {
        "budget busiest window": (
            f"{requests} / {BUDGET_REQUESTS} requests, {tokens:,} / {BUDGET_TOKENS:,} tokens"
        ),
        "budget utilisation (tokens, first to last call)": (
            f"{spent / (BUDGET_TOKENS * windows):.2f}"
        ),
    }
    return finding, figures


@dataclass
class CapSamples:
    most: Counter[str] = field(default_factory=Counter)
    samples: int = 0

    def sample(self, running_tenants: list[str]) -> None:
        self.samples += 1
        for tenant, n in Counter(running_tenants).items():
            self.most[tenant] = max(self.most[tenant], n)


def check_caps(caps: CapSamples) -> Finding:
    finding = Finding("no tenant ran more turns at once than its cap (sampled)")
    for tenant, most in caps.most.items():
        cap = TENANT_CAPS.get(tenant, TENANT_CAPS["*"])
        if most > cap:
            finding.fail(f"{tenant}: {most} running at once, cap {cap}")
    if not caps.samples:
        finding.fail("never sampled")
    return finding


def latency_rows(turns: list[Any]) -> list[tuple[str, str]]:
    """p50/p95/p99 of submission to end, per tenant, over the succeeded turns."""
    rows = []
    by_tenant: dict[str, list[float]] = {}
    for turn in turns:
        if turn.state == "succeeded":
            spent = (turn.number("finished_at_ms") - turn.number("created_at_ms")) / 1000
            by_tenant.setdefault(turn.plan.tenant, []).append(spent)
    for tenant, spans in sorted(by_tenant.items()):
        spans.sort()

        def at(q: float, spans: list[float] = spans) -> float:
            return spans[min(len(spans) - 1, int(q * len(spans)))]

        rows.append(
            (
                f"latency {tenant} (p50 / p95 / p99)",
                f"{at(0.5):.2f} / {at(0.95):.2f} / {at(0.99):.2f} s over {len(spans)} turns",
            )
        )
    return rows


# --- all of them, as the soak's driver runs them ---------------------------------------------


@dataclass
class Extras:
    """The mixed run's actors beside the driver: started with the run, fed every wave,
    sampled between steps, stopped once every turn has ended."""

    seed: int
    canceller: Canceller
    readers: StreamReaders
    inputs: BadInputs = field(default_factory=BadInputs)
    caps: CapSamples = field(default_factory=CapSamples)
    plans: dict[str, PlannedTurn] = field(default_factory=dict)
    owned: list[tuple[PlannedTurn, str]] = field(default_factory=list)
    memory_peak: int = 0
    threads: list[threading.Thread] = field(default_factory=list)
    _sampled_at: float = 0.0

    @classmethod
    def for_seed(cls, seed: int) -> Extras:
        return cls(seed, Canceller(seed), StreamReaders(seed))

    def start(self) -> None:
        self.threads = [threading.Thread(target=self.canceller.run, daemon=True)]
        self.threads += [
            threading.Thread(target=self.readers.run, args=(i,), daemon=True)
            for i in range(STREAM_READERS)
        ]
        for thread in self.threads:
            thread.start()

    def submitted(self, wave: list[PlannedTurn], task_ids: list[str]) -> None:
        pairs = list(zip(wave, task_ids, strict=True))
        self.plans.update({task_id: plan for plan, task_id in pairs})
        self.owned += pairs
        self.canceller.add(pairs)
        self.readers.add(task_ids)
        rng = random.Random(self.seed * 7 + len(self.owned))
        self.inputs.trickle(rng, self.owned)

    def sample(self, observer: Any) -> None:
        """Running turns per tenant, and Redis's memory, at most every 0.5 s."""
        if time.monotonic() - self._sampled_at < 0.5:
            return
        self._sampled_at = time.monotonic()
        running = observer.running()
        self.caps.sample([self.plans[t].tenant for t in running if t in self.plans])
        try:
            used = int(observer.client.info("memory")["used_memory"])
        except (redis.ConnectionError, redis.TimeoutError):
            return
        self.memory_peak = max(self.memory_peak, used)

    def stop(self) -> None:
        self.canceller.stop.set()
        self.readers.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)
