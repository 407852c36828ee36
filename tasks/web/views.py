"""What each console page shows, read from the store as plain data: the same data fills the
HTML page and its JSON form. Every function here is blocking (redis-py); the routes call them
in Starlette's thread pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from agent import AgentError
from tasks.budgets.usage import read_usage
from tasks.core.errors import JobError
from tasks.core.namespaces import namespace_for, owner_of_namespace
from tasks.operate.inspect import live_stats, state_store
from tasks.operate.listing import TurnFilter, TurnPage, page_turns
from tasks.operate.status import TurnStatus
from tasks.queue.context import JobContext
from tasks.store.dead_letters import StoredEntry
from tasks.store.pending import PendingAction
from tasks.store.records import TurnRecord, TurnState

DAY_MS = 24 * 3600 * 1000
PAGE = 50


def when(epoch_ms: int) -> datetime | None:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC) if epoch_ms else None


def overview(ctx: JobContext) -> dict[str, Any]:
    """`/`: unfinished turns by state, the oldest runnable age, the pump and the workers, dead
    letters by reason, the budgets as counted now, the last day's tokens by tenant, and
    whether the state store is marked lost."""
    figures = live_stats(ctx)
    lost = figures["deadLetters"]["byReason"].get("state_lost", 0)
    budgets = [
        {"budget": budget.name, "limits": [vars(use) for use in ctx.ledger.in_use(budget)]}
        for budget in ctx.settings.budgets.budgets
    ]
    tenants: dict[str, dict[str, int]] = {}
    for row in read_usage(ctx.redis, ctx.keys, DAY_MS):
        totals = tenants.setdefault(row.tenant, {"inputTokens": 0, "outputTokens": 0})
        totals["inputTokens"] += row.input_tokens
        totals["outputTokens"] += row.output_tokens
    return {
        **figures,
        "workerBeats": worker_beats(ctx, figures["serverTimeMs"]),
        "state": state_store(ctx, state_lost_turns=lost),
        "budgets": budgets,
        "usageLastDay": [{"tenant": t, **n} for t, n in sorted(tenants.items())],
    }


def worker_beats(ctx: JobContext, now_ms: int) -> list[dict[str, Any]]:
    """Each worker with a heartbeat on record: its name, how long ago it beat, its slots, and
    whether that is within a lease lifetime (alive)."""
    raw: dict[bytes, bytes] = ctx.redis.hgetall(ctx.keys.workers)  # type: ignore[assignment]
    lifetime_ms = int(ctx.settings.lease_ttl_s * 1000)
    beats = []
    for name, value in sorted(raw.items()):
        try:
            beat = orjson.loads(value)
            at = int(beat["at"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # the pump removes an unreadable heartbeat
        beats.append(
            {
                "worker": name.decode(errors="replace"),
                "lastBeatAgeS": max(0, now_ms - at) / 1000,
                "slots": beat.get("slots"),
                "alive": at > now_ms - lifetime_ms,
            }
        )
    return beats


@dataclass(frozen=True)
class TurnsQuery:
    """`/turns`' filters as given in its query string ("" for none)."""

    state: str = ""
    tenant: str = ""
    agent: str = ""
    conversation: str = ""  # a conversation id; with `tenant` and `principal`, its namespace
    principal: str = ""
    after: str = ""

    @classmethod
    def of(cls, params: Mapping[str, str]) -> TurnsQuery:
        return cls(**{name: params.get(name, "").strip() for name in cls.__dataclass_fields__})

    def where(self) -> TurnFilter:
        """The filter, or ValueError naming a bad value."""
        state = None
        if self.state:
            try:
                state = TurnState(self.state)
            except ValueError:
                known = ", ".join(str(s) for s in TurnState)
                raise ValueError(f"state {self.state!r} is not one of {known}") from None
        namespace = None
        if self.conversation:
            namespace = namespace_for(self.conversation, _owner(self.tenant, self.principal))
        return TurnFilter(
            state=state,
            tenant=self.tenant or None,
            agent=self.agent or None,
            namespace=namespace,
        )

    def params(self, **changed: str) -> dict[str, str]:
        """The query string's parameters, with `changed` ones replaced: for page links."""
        given = {name: getattr(self, name) for name in self.__dataclass_fields__}
        given.update(changed)
        return {name: value for name, value in given.items() if value}


def turns(ctx: JobContext, query: TurnsQuery) -> TurnPage:
    return page_turns(ctx, query.where(), after=query.after or None, limit=PAGE)


def status_of(record: TurnRecord) -> TurnStatus:
    return TurnStatus.of(record, None)


@dataclass(frozen=True)
class JournalCall:
    """One call of the iteration in flight, as the journal holds it."""

    index: int
    tool: str
    tool_call_id: str
    effect: str
    attempt: int
    idempotency_key: str
    outcome: str  # "running" until finished, then "ok" or "failed"
    content: str


@dataclass(frozen=True)
class TurnView:
    status: TurnStatus
    record: TurnRecord
    journal: list[JournalCall] = field(default_factory=list)
    reason: str = ""  # the dead-letter reason, for a dead-lettered turn
    result: Any = None
    # The newest event when the page was read: the page's stream replays the events up to it
    # without asking for the parts again, since they already show what those events did.
    last_event_id: str = "0-0"

    @property
    def pending(self) -> tuple[PendingAction, ...]:
        return self.status.pending


def turn(ctx: JobContext, turn_id: str) -> TurnView | None:
    record = ctx.records.find(turn_id)
    if record is None:
        return None
    behind = None
    if record.state is TurnState.QUEUED and record.namespace:
        behind = ctx.records.turn_ahead(turn_id, record.namespace)
    events_key = ctx.keys.for_namespace(record.namespace).events(turn_id)
    newest: list[Any] = ctx.redis.xrevrange(events_key, count=1)  # type: ignore[assignment]
    return TurnView(
        TurnStatus.of(record, behind),
        record,
        journal_calls(record),
        record.reason,
        record.result,
        newest[0][0].decode() if newest else "0-0",
    )


def journal_calls(record: TurnRecord) -> list[JournalCall]:
    """The tool calls of the turn's iteration in flight, from its journal: the model's
    response names them, each call's entry says what ran (tasks/store/journal.py)."""
    raw = record.journal.get("journal:response")
    if not raw:
        return []
    try:
        message = orjson.loads(raw).get("message") or {}
        planned = list(message.get("toolCalls") or [])
    except (orjson.JSONDecodeError, AttributeError):
        return []
    calls = []
    for index, planned_call in enumerate(planned):
        entry_raw = record.journal.get(f"journal:{index}")
        entry = orjson.loads(entry_raw) if entry_raw else {}
        outcome = "not started"
        if entry:
            outcome = "running" if "ok" not in entry else ("ok" if entry["ok"] else "failed")
        calls.append(
            JournalCall(
                index=index,
                tool=str(planned_call.get("name", "")),
                tool_call_id=str(planned_call.get("id", "")),
                effect=str(entry.get("effect", "")),
                attempt=int(entry.get("attempt") or 0),
                idempotency_key=str(entry.get("idempotencyKey", "")),
                outcome=outcome,
                content=str(entry.get("content", ""))[:2000],
            )
        )
    return calls


def approvals(ctx: JobContext) -> list[tuple[TurnStatus, PendingAction]]:
    """Every pending action across paused turns, oldest request first."""
    found: list[tuple[TurnStatus, PendingAction]] = []
    after = None
    while True:
        page = page_turns(ctx, TurnFilter(state=TurnState.PAUSED), after=after, limit=500)
        for record in page.turns:
            status = status_of(record)
            found.extend((status, action) for action in status.pending)
        if page.cursor is None:
            break
        after = page.cursor
    return sorted(found, key=lambda pair: (pair[1].requested_at, pair[1].turn_id))


@dataclass(frozen=True)
class ConversationPage:
    tenant: str
    principal: str
    conversation_id: str
    messages: list[dict[str, Any]]
    total: int
    start: int
    unreadable: str
    unfinished: list[TurnRecord]


def conversation(
    ctx: JobContext, tenant: str, principal: str, conversation_id: str, start: int
) -> ConversationPage:
    """One page of a conversation's transcript (`_` for no tenant or principal)."""
    namespace = namespace_for(conversation_id, _owner(tenant, principal))
    checkpoint, unreadable = None, ""
    try:
        checkpoint = ctx.store.load(namespace)
    except (JobError, AgentError) as exc:
        unreadable = str(exc)
    history: list[dict[str, Any]] = []
    if checkpoint is not None:
        history = list(checkpoint.to_dict().get("history") or [])
    queue: list[bytes] = ctx.redis.lrange(  # type: ignore[assignment]
        ctx.keys.for_namespace(namespace).queue(namespace), 0, -1
    )
    unfinished = [r for raw in queue if (r := ctx.records.get(raw.decode(), namespace))]
    start = max(0, min(start, max(0, len(history) - 1)))
    return ConversationPage(
        tenant,
        principal,
        conversation_id,
        history[start : start + PAGE],
        len(history),
        start,
        unreadable,
        unfinished,
    )


def _owner(tenant: str, principal: str) -> dict[str, str]:
    """The identity a page's tenant and principal name; `_` or "" for none."""
    given = {"tenant": tenant, "principal": principal}
    return {name: value for name, value in given.items() if value not in ("", "_")}


@dataclass(frozen=True)
class DeadLetterQuery:
    reason: str = ""
    agent: str = ""
    tenant: str = ""

    @classmethod
    def of(cls, params: Mapping[str, str]) -> DeadLetterQuery:
        return cls(**{name: params.get(name, "").strip() for name in cls.__dataclass_fields__})

    def matches(self, entry: StoredEntry) -> bool:
        summary = entry.summary
        if summary is None:  # unreadable: what it was cannot be told, so it is never hidden
            return True
        tenant = owner_of_namespace(str(summary.get("namespace", "")))[0] or ""
        return (
            self.reason in ("", summary.get("reason"))
            and self.agent in ("", summary.get("agent"))
            and self.tenant in ("", tenant)
        )

    def params(self) -> dict[str, str]:
        return {n: v for n in self.__dataclass_fields__ if (v := getattr(self, n))}


def dead_letters(ctx: JobContext, query: DeadLetterQuery) -> list[StoredEntry]:
    """The entries matching `query`, oldest failure first."""
    return [entry for entry in ctx.dead_letters.stored_entries() if query.matches(entry)]


def entry_row(entry: StoredEntry) -> dict[str, Any]:
    """An entry for the page and its JSON: the summary with its times in ISO 8601."""
    row = {
        "taskId": entry.turn_id,
        "unreadable": "",
        "errorType": "",
        "error": "",
        **entry.as_dict(),
    }
    row["lastFailedAt"] = when(entry.failed_at_ms)
    row["tenant"] = owner_of_namespace(str(row.get("namespace", "")))[0]
    return row
