"""The contract between the state store's Lua scripts (tasks/store/lua/) and the Python that
calls them (tasks/store/records.py), written once: the turn states and which of them are
terminal, the event types of a turn's stream and the fields of a stream entry, the turn record's
hash fields, the shard counters, each script's replies, and each script's KEYS and ARGV in order.

Python uses the names here directly. The Lua side gets them as tables that `lua_prelude`
generates when a script is loaded (tasks/store/records.py, `_source`), put in front of the
functions of common.lua the script uses (`lua_common`) and the script's body:

    STATE     TurnState, by member name          STATE.RUNNING    -> "running"
    TERMINAL  TERMINAL_STATES, a set             TERMINAL[state]  -> true or nil
    EVENT     Event, by member name              EVENT.TURN_QUEUED -> "turn.queued"
    F         Field, by lower-case name          F.attempt        -> "attempt"
    FP        FieldPrefix, by lower-case name    FP.frame .. n    -> "frame:<n>"
    EF        EventField, by lower-case name     EF.type          -> "type"
    COUNTER   CounterName, by name               COUNTER.SUBMITTED -> "submitted"
    R         the script's replies, by name      R.CLAIMED        -> "claimed"
    K         the script's KEYS, by name         K.turn           -> KEYS[1]
    A         the script's ARGV, by name         A.turn_id        -> ARGV[1]
    REST      where the ARGV after the named ones begins (scripts that take more)

The scripts never spell a state, an event type, a field name or a reply as a string, and never
index KEYS or ARGV by number: they go through these tables, so a name the schema does not have
fails when the script is loaded, not halfway through a turn (tests/tasks/test_schema.py checks
the rest). The Python call sites pass KEYS and ARGV as mappings by name, which
ScriptSchema.keys_from and args_from put in the schema's order.

Every script runs its prelude on each call, so it is kept small: STATE, EVENT, F, FP, EF,
COUNTER and R hold only the names the script's text uses, and a table none of it uses is left
out. The text is the same for the same files, so Redis's script cache (by SHA) keeps it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum, StrEnum
from typing import Any, Final


class TurnState(StrEnum):
    """A turn's state, the `state` field of its record (docs/operations.md, "Turn states and
    status"; tasks/store/records.py draws how each is reached). Every one is written: `queued`
    by register, a handover and a decision that ends a pause; `running` by claim; `waiting` by
    retry until its due time; `paused` by pause until a person decides; and the three terminal
    ones, `succeeded` by succeed, `dead_lettered` by dead_letter and `cancelled` by cancel."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"  # for a retry
    PAUSED = "paused"  # for a person's decision
    SUCCEEDED = "succeeded"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


# The states a turn never leaves.
TERMINAL_STATES: Final = frozenset(
    {TurnState.SUCCEEDED, TurnState.DEAD_LETTERED, TurnState.CANCELLED}
)


class Event(StrEnum):
    """The types of the events in a turn's stream (docs/operations.md, "Events"), each written
    by the script that makes the change it reports."""

    TURN_QUEUED = "turn.queued"  # register
    TURN_STARTED = "turn.started"  # claim
    TOOL_STARTED = "tool.started"  # journal, the type given by the worker
    TOOL_FINISHED = "tool.finished"  # journal, the type given by the worker
    ITERATION_PERSISTED = "iteration.persisted"  # progress, with a frame
    RETRY_SCHEDULED = "retry.scheduled"  # retry
    # Streamed answer text {text}, coalesced by the worker (tasks/turn/tokens.py): tokens.
    TOKEN_DELTA = "token.delta"
    # {attempt}: that attempt's deltas of the iteration in flight are void (tokens.lua has
    # the rule): retry, after an attempt that streamed; tokens, when a takeover streams again.
    ATTEMPT_DISCARDED = "attempt.discarded"
    TURN_HANDED_OVER = "turn.handed_over"  # handover
    TURN_PAUSED = "turn.paused"  # pause
    ACTION_DECIDED = "action.decided"  # decide
    TURN_RESUMED = "turn.resumed"  # decide, the last decision of a pause
    TURN_SUCCEEDED = "turn.succeeded"  # succeed
    TURN_DEAD_LETTERED = "turn.dead_lettered"  # dead_letter
    TURN_CANCELLED = "turn.cancelled"  # cancel
    # {waitingFor, budget, limit, dueAt}: a model call waits for a budget or a tenant cap: wait
    BUDGET_WAITING = "budget.waiting"


# The events that end a turn's stream: one per terminal state.
TERMINAL_EVENTS: Final = frozenset(
    {Event.TURN_SUCCEEDED, Event.TURN_DEAD_LETTERED, Event.TURN_CANCELLED}
)


class EventField:
    """The fields of one entry of a turn's event stream (common.lua, `emit_json`)."""

    TYPE: Final = "type"  # an Event
    ATTEMPT: Final = "attempt"
    ITERATION: Final = "iteration"
    AT: Final = "at"  # server epoch ms
    DATA: Final = "data"  # a JSON object


class Field:
    """The fields of a turn record's hash (ShardKeys.turn; TurnRecord reads them)."""

    STATE: Final = "state"  # a TurnState
    PAYLOAD: Final = "payload"  # the run_turn keyword arguments as submitted (JSON)
    AGENT: Final = "agent"
    CONVERSATION_ID: Final = "conversation_id"
    NAMESPACE: Final = "namespace"
    ATTEMPT: Final = "attempt"
    DELIVERIES: Final = "deliveries"
    REDELIVERIES: Final = "redeliveries"
    ITERATION: Final = "iteration"
    CREATED_AT_MS: Final = "created_at_ms"
    UPDATED_AT_MS: Final = "updated_at_ms"
    STARTED_AT_MS: Final = "started_at_ms"
    FINISHED_AT_MS: Final = "finished_at_ms"
    DUE_AT_MS: Final = "due_at_ms"
    FIRST_FAILED_AT_MS: Final = "first_failed_at_ms"
    WORKER: Final = "worker"
    TOKEN: Final = "token"  # the lease token of the running delivery
    CHECKPOINT: Final = "checkpoint"  # a whole checkpoint (JSON)
    FRAMES: Final = "frames"  # how many frame:<n> fields there are
    BASE: Final = "base"  # the stored conversation the frames build on, once the turn ended
    # ... with the conversation frames on top of that envelope then (a JSON array of them)
    BASE_FRAMES: Final = "base_frames"
    LAST_ERROR: Final = "last_error"
    RESULT: Final = "result"  # the reply of a succeeded turn (JSON)
    DLQ_ID: Final = "dlq_id"
    REASON: Final = "reason"  # why it was dead-lettered
    REPLAY_OF: Final = "replay_of"
    REPLAYED_AS: Final = "replayed_as"
    DEADLINE_AT_MS: Final = "deadline_at_ms"
    DEADLINE_LEFT_MS: Final = "deadline_left_ms"  # while paused: the deadline's clock stopped
    CANCEL_REASON: Final = "cancel_reason"
    HANDOVERS: Final = "handovers"
    HANDED_OVER: Final = "handed_over"  # set until the next claim: it goes on with this delivery
    PAUSED_AT_MS: Final = "paused_at_ms"
    PAUSE_EXPIRES_AT_MS: Final = "pause_expires_at_ms"
    TRACE: Final = "trace"  # W3C trace context (JSON carrier)
    RUNNABLE_AT_MS: Final = "runnable_at_ms"
    # What a waiting turn waits for when it is not a retry: "budget" or "tenant_tokens" (wait);
    # the next claim removes it.
    WAITING_FOR: Final = "waiting_for"
    # Tenant fairness (tasks/turn/fairness.py): the turn's tenant ('' for none), and, while the
    # fairness gate counts it in flight, the gate's key tag (removed when it stops running).
    TENANT: Final = "tenant"
    GATE: Final = "gate"
    # '<iteration>|<lease token>' of the attempt's last token.delta (tokens.lua); the retry
    # that ends the attempt removes it.
    STREAMED: Final = "streamed"
    # The journal of the iteration in flight (tasks/store/journal.py), besides journal:<index>.
    JOURNAL_RESPONSE: Final = "journal:response"
    JOURNAL_CALLS: Final = "journal:calls"
    JOURNAL_REQUESTS: Final = "journal:requests"  # a pause's requests (JSON)
    JOURNAL_REQUEST_IDS: Final = "journal:request_ids"  # their ids, space-separated


class FieldPrefix:
    """Turn record fields named by a prefix and a number or an id."""

    FRAME: Final = "frame:"  # frame:1 .. frame:<frames> (tasks/store/progress.py)
    JOURNAL: Final = "journal:"  # journal:<index>, one per call that started
    REQUEST: Final = "request:"  # request:<id> -> kind, for each request of a pause
    DECISION: Final = "decision:"  # decision:<id> -> the decision body
    DECIDED_BY: Final = "decided_by:"  # decided_by:<id> -> who decided


class CounterName:
    """The fields of a shard's counters hash (ShardKeys.counters), counted by the scripts."""

    SUBMITTED: Final = "submitted"
    RETRIES_SCHEDULED: Final = "retries_scheduled"
    LEASE_TAKEOVERS: Final = "lease_takeovers"
    HANDOVERS: Final = "handovers"
    PAUSES: Final = "pauses"
    FINISHED: Final = "finished:"  # followed by the terminal state
    DEAD_LETTERED: Final = "dead_lettered:"  # followed by the reason
    BUDGET_WAITS: Final = "budget_waits:"  # followed by the budget ("provider:model")
    # Reported tokens: "tokens" US direction US model [US tenant], US the unit separator \x1f
    # (tasks/budgets/usage.py writes them, through common.lua's add_usage).
    TOKENS: Final = "tokens\x1f"


# -- replies ------------------------------------------------------------------------------------


class ClaimStatus(StrEnum):
    """claim.lua's reply: the first item of {status, ...}."""

    CLAIMED = "claimed"
    MISSING = "missing"  # no record (never registered, or expired)
    DONE = "done"  # the turn already ended
    PAUSED = "paused"  # waiting for a person's decision
    NOT_DUE = "not_due"  # waiting out its backoff
    NOT_HEAD = "not_head"  # an earlier turn of the conversation is unfinished
    # Its tenant is at its running cap (AGENTJOBS_TENANT_MAX_RUNNING): held for the fairness
    # gate, which publishes it again when a place frees.
    CAPPED = "capped"
    BUSY = "busy"  # another delivery holds the conversation lease


class Outcome(StrEnum):
    """The first item of the replies of succeed, dead_letter, cancel and handover."""

    OK = "ok"
    DONE = "done"  # the turn had already ended (dead_letter, cancel)
    LOST = "lost"  # the lease is no longer this delivery's (succeed, dead_letter, handover)


class Decided(StrEnum):
    """decide.lua's reply: the first item of {status, ...}."""

    RECORDED = "recorded"  # other requests of the pause are still undecided
    RESUMED = "resumed"  # with agent and conversation id: the pause is over, the turn queued
    SAME = "same"  # decided before, the same way
    CONFLICT = "conflict"  # decided before, otherwise
    KIND = "kind"  # with the request's kind: the decision does not fit it
    UNKNOWN = "unknown"  # the request was never pending on this turn
    ENDED = "ended"  # with the state: the pause ended before this decision
    MISSING = "missing"  # no record


class RegisterReply(IntEnum):
    """register.lua's reply."""

    CREATED = 1
    EXISTS = 0  # the same turn id with the same payload
    CONFLICT = -1  # the same turn id with another payload
    HELD = 2  # recorded, and held by the fairness gate: no message until it is released


class Registered(StrEnum):
    """What registering a turn came to (TurnRecords.register, tasks/turn)."""

    CREATED = "created"
    EXISTS = "exists"  # the same turn id with the same request: an idempotent resubmission
    CONFLICT = "conflict"  # the same turn id with another request: refused
    FOREIGN = "foreign"  # the turn id names a turn of another conversation: refused
    HELD = "held"  # created, and held by the fairness gate: publish nothing (it releases it)


# register.lua's reply as a Registered (FOREIGN is found before the script runs).
REGISTERED: Final[Mapping[int, Registered]] = {
    RegisterReply.CREATED: Registered.CREATED,
    RegisterReply.EXISTS: Registered.EXISTS,
    RegisterReply.CONFLICT: Registered.CONFLICT,
    RegisterReply.HELD: Registered.HELD,
}


# -- scripts ------------------------------------------------------------------------------------


class SchemaMismatch(ValueError):
    """A script call or a script text that does not fit the schema."""


@dataclass(frozen=True)
class ScriptSchema:
    """One script of tasks/store/lua/: the names of its KEYS and ARGV, in order."""

    name: str  # tasks/store/lua/<name>.lua
    keys: tuple[str, ...]
    args: tuple[str, ...] = ()
    # Arguments after `args` that are passed all together or not at all.
    optional: tuple[str, ...] = ()
    # What comes after the named arguments, when the script takes more (REST in Lua).
    rest: str = ""
    replies: type[Enum] | None = None

    def keys_from(self, named: Mapping[str, str]) -> list[str]:
        """The KEYS of a call, in order, from the keys by name: exactly the script's names."""
        ordered = _in_order(self.keys, named)
        if ordered is None:
            raise SchemaMismatch(self._misfit("KEYS", self.keys, named))
        return ordered

    def args_from(self, named: Mapping[str, Any], rest: Sequence[Any] = ()) -> list[Any]:
        """The ARGV of a call, in order, from the arguments by name (the script's `args`, and
        its `optional` ones all or none), followed by `rest`."""
        names = self.args
        if self.optional and self.optional[0] in named:
            names = self.args + self.optional
        ordered = _in_order(names, named)
        if ordered is None:
            raise SchemaMismatch(self._misfit("ARGV", names, named))
        if rest:
            if not self.rest:
                raise SchemaMismatch(f"{self.name}.lua takes no ARGV after {', '.join(names)}")
            ordered += rest
        return ordered

    def _misfit(self, what: str, names: tuple[str, ...], named: Mapping[str, Any]) -> str:
        missing = [name for name in names if name not in named]
        unexpected = sorted(set(named) - set(names))
        return (
            f"{self.name}.lua takes {what} {', '.join(names) or '(none)'}: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'}"
        )


def _in_order(names: tuple[str, ...], named: Mapping[str, Any]) -> list[Any] | None:
    """The values of `named` in the order of `names`, or None unless it has those names alone."""
    if len(named) != len(names):
        return None
    try:
        return [named[name] for name in names]
    except KeyError:
        return None


# The keys common.lua's end_turn reads, first in the KEYS of every script that ends a turn.
ENDING_KEYS: Final = (
    "turn",
    "lease",
    "running",
    "queue",
    "retries",
    "pending",
    "finished",
    "events",
    "deadlines",
    "conversation",
    "conversation_frames",
    "pauses",
)

REGISTER: Final = ScriptSchema(
    "register",
    # broker_queue: the broker's list the turn's message is pushed onto, when the broker is
    # this Redis and the caller folds its publish into the registration (the turn key again
    # when not: tasks/queue/broker.py, PublishFold).
    keys=("turn", "queue", "pending", "events", "deadlines", "submitted", "broker_queue"),
    args=(
        "turn_id",
        "payload",
        "agent",
        "conversation_id",
        "namespace",
        "checkpoint",
        "replay_of",
        "deadline_ms",
        "trace",
        # Tenant fairness (tasks/turn/fairness.py): the gate's key tag ('' when off or not
        # gated), its settings (JSON), the turn's tenant.
        "gate",
        "gate_cfg",
        "tenant",
        # The message (kombu's encoding) for broker_queue, '' for none.
        "message",
    ),
    replies=RegisterReply,
)
UNREGISTER: Final = ScriptSchema(
    "unregister",
    keys=("turn", "queue", "pending", "events", "deadlines", "submitted"),
    args=("turn_id",),
)
CLAIM: Final = ScriptSchema(
    "claim",
    keys=(
        "turn",
        "queue",
        "lease",
        "retries",
        "running",
        "pending",
        "conversation",
        "conversation_frames",
        "events",
    ),
    args=("turn_id", "token", "lease_ms", "worker", "gate", "gate_cfg"),
    replies=ClaimStatus,
)
PROGRESS: Final = ScriptSchema(
    "progress",
    keys=("turn", "lease", "running", "events"),
    args=("turn_id", "token", "lease_ms"),
    optional=("frame", "iteration", "ends_iteration"),
    rest="with a frame: the data of a tool.finished event per call whose outcome it holds",
)
HANDOVER: Final = ScriptSchema(
    "handover",
    keys=("turn", "lease", "running", "pending", "events"),
    args=("turn_id", "token", "worker", "reason"),
    replies=Outcome,
)
PAUSE: Final = ScriptSchema(
    "pause",
    keys=("turn", "lease", "running", "events", "deadlines", "pauses"),
    args=("turn_id", "token", "ttl_ms", "frame", "requests", "request_count"),
    rest="request_count (request id, kind) pairs, then journal field/value pairs",
)
DECIDE: Final = ScriptSchema(
    "decide",
    keys=("turn", "events", "deadlines", "pauses", "pending"),
    args=("turn_id", "request_id", "decision", "body", "actor", "event"),
    replies=Decided,
)
TRACE: Final = ScriptSchema("trace", keys=("turn", "lease"), args=("turn_id", "token", "trace"))
JOURNAL: Final = ScriptSchema(
    "journal",
    keys=("turn", "lease", "events"),
    args=("turn_id", "token", "event_type", "event_data"),
    rest="journal field/value pairs",
)
SUCCEED: Final = ScriptSchema(
    "succeed",
    # celery_result: the Celery result backend's key for the turn, when that backend is the
    # state Redis (tasks/queue/results.py, inline_result); otherwise the turn's own key, unused.
    keys=(*ENDING_KEYS, "celery_result"),
    args=(
        "turn_id",
        "token",
        # The conversation as the turn leaves it: a whole envelope (a compaction), or else a
        # frame appended to conversation_frames; the other one ''.
        "envelope",
        "frame",
        "result",
        "ttl_s",
        "turn_prefix",
        "celery_meta",
        "celery_ttl_s",
    ),
    # The tokens the turn's last attempt reported (tasks/budgets/usage.py, usage_json).
    optional=("usage",),
    replies=Outcome,
)
TOKENS: Final = ScriptSchema(
    "tokens",
    keys=("turn", "lease", "events", "tokens"),
    args=("turn_id", "token", "data", "check_ms"),
)
DROP_TOKENS: Final = ScriptSchema(
    "drop_tokens", keys=("turn", "events", "tokens"), args=("turn_id", "ttl_ms")
)
RETRY: Final = ScriptSchema(
    "retry",
    keys=("turn", "lease", "running", "retries", "events"),
    args=("turn_id", "token", "delay_ms", "next_attempt", "checkpoint", "error"),
)
WAIT: Final = ScriptSchema(
    "wait",
    keys=("turn", "lease", "running", "retries", "events"),
    args=("turn_id", "token", "due_at_ms", "waiting_for", "budget", "limit"),
)
GATE_FILL: Final = ScriptSchema("gate_fill", keys=(), args=("gate", "gate_cfg", "limit"))
GATE_SWEEP: Final = ScriptSchema("gate_sweep", keys=(), args=("gate", "stale_ms", "limit"))
USAGE: Final = ScriptSchema("usage", keys=("turn",), args=("turn_id", "usage"))
DEAD_LETTER: Final = ScriptSchema(
    "dead_letter",
    keys=(*ENDING_KEYS, "dead_letters", "dead_letter_index"),
    args=("turn_id", "token", "entry_id", "entry", "reason", "checkpoint", "turn_prefix"),
    replies=Outcome,
)
CANCEL: Final = ScriptSchema(
    "cancel",
    keys=ENDING_KEYS,
    args=("turn_id", "reason", "ttl_s", "turn_prefix"),
    replies=Outcome,
)
TAKE_DUE: Final = ScriptSchema(
    "take_due", keys=("index",), args=("limit", "bump_ms", "lag_ms", "turn_prefix")
)
# The pump's probe: no KEYS, since the indices it reads span shards (one call per Redis node);
# `indices` packs them in one argument, "key lag_ms key lag_ms ...".
DUE_PROBE: Final = ScriptSchema("due_probe", keys=(), args=("indices",))
LEASE_HOLDER: Final = ScriptSchema("lease_holder", keys=("lease",))
WORKER_BEAT: Final = ScriptSchema(
    "worker_beat", keys=("workers",), args=("name", "received", "slots")
)

# Every script, by name: one for each tasks/store/lua/<name>.lua but common.lua.
SCRIPTS: Final[Mapping[str, ScriptSchema]] = {
    script.name: script
    for script in (
        REGISTER,
        UNREGISTER,
        CLAIM,
        PROGRESS,
        HANDOVER,
        PAUSE,
        DECIDE,
        TRACE,
        JOURNAL,
        TOKENS,
        DROP_TOKENS,
        SUCCEED,
        RETRY,
        WAIT,
        GATE_FILL,
        GATE_SWEEP,
        USAGE,
        DEAD_LETTER,
        CANCEL,
        TAKE_DUE,
        DUE_PROBE,
        LEASE_HOLDER,
        WORKER_BEAT,
    )
}


# -- the Lua prelude ----------------------------------------------------------------------------


def _constants(holder: type) -> dict[str, str]:
    """The UPPER_CASE str attributes of a class of names, in the order they are written."""
    return {
        name: value
        for name, value in vars(holder).items()
        if name.isupper() and isinstance(value, str)
    }


# The tables every script may use, by their Lua name: name in Lua -> value.
LUA_TABLES: Final[Mapping[str, Mapping[str, str]]] = {
    "STATE": {state.name: state.value for state in TurnState},
    "EVENT": {event.name: event.value for event in Event},
    "F": {name.lower(): value for name, value in _constants(Field).items()},
    "FP": {name.lower(): value for name, value in _constants(FieldPrefix).items()},
    "EF": {name.lower(): value for name, value in _constants(EventField).items()},
    "COUNTER": _constants(CounterName),
}
# The tables of one script: its replies, KEYS, ARGV, and where the ARGV after those begins.
SCRIPT_TABLES: Final = ("R", "K", "A", "REST")
# A set, used as TERMINAL[state].
TERMINAL_TABLE: Final = "TERMINAL"

_LUA_KEYWORDS = frozenset(
    [
        "and",
        "break",
        "do",
        "else",
        "elseif",
        "end",
        "false",
        "for",
        "function",
        "if",
        "in",
        "local",
        "nil",
        "not",
        "or",
        "repeat",
        "return",
        "then",
        "true",
        "until",
        "while",
    ]
)
# A string literal or a comment (a long bracket one is refused: see lua_code).
_STRING_OR_COMMENT = re.compile(r"""--[^\n]*|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*\"""")
_LONG_BRACKET = re.compile(r"\[=*\[")
_TABLE_NAMES = "|".join([*LUA_TABLES, *SCRIPT_TABLES, TERMINAL_TABLE])
# A use of one of the tables, with the name it reads when it reads one with `.name`.
LUA_REFERENCE: Final = re.compile(
    rf"(?<![\w.:])({_TABLE_NAMES})(?![\w])(?:\s*\.\s*([A-Za-z_]\w*))?"
)


def _lua_pieces(text: str) -> Iterator[re.Match[str]]:
    for match in _STRING_OR_COMMENT.finditer(text):
        if match.group().startswith("--") and _LONG_BRACKET.match(match.group(), 2):
            raise SchemaMismatch("long comments (--[[ ... ]]) are not used in the scripts")
        yield match


def lua_code(text: str) -> str:
    """Lua source with its comments removed and each string literal left as '' (lines kept), to
    find the names the code uses. Long brackets ([[...]]) are refused: the scripts have none."""
    parts: list[str] = []
    end = 0
    for match in _lua_pieces(text):
        parts.append(text[end : match.start()])
        parts.append("" if match.group().startswith("--") else "''")
        end = match.end()
    parts.append(text[end:])
    code = "".join(parts)
    if _LONG_BRACKET.search(code):
        raise SchemaMismatch("long strings ([[ ... ]]) are not used in the scripts")
    return code


def lua_strings(text: str) -> list[str]:
    """The string literals of Lua source, as written between their quotes."""
    return [m.group()[1:-1] for m in _lua_pieces(text) if not m.group().startswith("--")]


# A top-level function of common.lua, with the comment lines right above it.
_LUA_FUNCTION = re.compile(r"^(?:--[^\n]*\n)*local function (\w+)\(", re.M)
_LUA_NAME = re.compile(r"(?<![\w.:])[A-Za-z_]\w*")


def lua_common(common: str, body: str) -> str:
    """The part of common.lua (`common`) a script whose own text is `body` runs: the comment it
    opens with and the functions the body uses, directly or through one another, in
    common.lua's order. A script builds only what it can call (and lua_prelude only the names
    those use) on every call. common.lua holds nothing but comments and top-level `local
    function`s, each ending with `end` on a line of its own: anything else raises
    SchemaMismatch, as it would be dropped."""
    starts = list(_LUA_FUNCTION.finditer(common))
    head = common[: starts[0].start()] if starts else common
    if lua_code(head).strip():
        raise SchemaMismatch("common.lua has code outside its functions")
    chunks: dict[str, str] = {}
    for match, after in zip(starts, [*starts[1:], None], strict=True):
        chunk = common[match.start() : after.start() if after else len(common)]
        outer = [line for line in lua_code(chunk).splitlines() if line and not line[0].isspace()]
        if outer[1:] != ["end"]:
            raise SchemaMismatch(f"common.lua's {match.group(1)} is not a function alone")
        chunks[match.group(1)] = chunk
    uses = {name: set(_LUA_NAME.findall(lua_code(chunk))) for name, chunk in chunks.items()}
    needed: set[str] = set()
    waiting = set(_LUA_NAME.findall(lua_code(body))) & chunks.keys()
    while waiting:
        name = waiting.pop()
        needed.add(name)
        waiting |= (uses[name] & chunks.keys()) - needed
    return head + "".join(chunk for name, chunk in chunks.items() if name in needed)


def _lua_value(value: str | int) -> str:
    if isinstance(value, int):
        return str(value)
    if not value.isascii() or not value.isprintable() or '"' in value or "\\" in value:
        raise SchemaMismatch(f"{value!r} is not a plain Lua string")
    return f'"{value}"'


def _lua_table(entries: Iterable[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{name} = {value}" for name, value in entries) + "}"


def _check_name(table: str, name: str) -> None:
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in _LUA_KEYWORDS:
        raise SchemaMismatch(f"{table}.{name}: not a name Lua can read with a dot")


for _table, _entries in LUA_TABLES.items():
    for _name in _entries:
        _check_name(_table, _name)


def lua_prelude(script: ScriptSchema, source: str) -> str:
    """The Lua `script` begins with, defining the tables of the schema that `source` (the
    script's part of common.lua and its body) uses: STATE, EVENT, F, FP, EF, COUNTER and R
    with only the names it uses, TERMINAL whole, K and A with all of the script's KEYS and
    ARGV, and REST. A use of a name the schema (or the script) does not have, or of a table
    of names other than as TABLE.name, raises SchemaMismatch."""
    used = _used_names(script, source)
    replies: dict[str, str | int] = {}
    if script.replies is not None:
        replies = {member.name: member.value for member in script.replies}
    argv = script.args + script.optional
    positions = {
        "K": {name: f"KEYS[{i}]" for i, name in enumerate(script.keys, 1)},
        "A": {name: f"ARGV[{i}]" for i, name in enumerate(argv, 1)},
    }
    _check_known(script, used, {**LUA_TABLES, "R": replies, **positions})
    lines = [f"-- Generated from tasks/core/schema.py for {script.name}.lua (lua_prelude)."]
    for table, entries in {**LUA_TABLES, "R": replies}.items():
        if table in used:
            chosen = ((n, _lua_value(v)) for n, v in entries.items() if n in used[table])
            lines.append(f"local {table} = {_lua_table(chosen)}")
    if TERMINAL_TABLE in used:
        terminal = (f"[{_lua_value(s.value)}]" for s in TurnState if s in TERMINAL_STATES)
        lines.append(f"local {TERMINAL_TABLE} = {_lua_table((t, 'true') for t in terminal)}")
    for table, entries in positions.items():
        for name in entries:
            _check_name(table, name)
        if entries:
            lines.append(f"local {table} = {_lua_table(entries.items())}")
    if script.rest:
        lines.append(f"local REST = {len(argv) + 1}")
    return "\n".join(lines) + "\n"


def _used_names(script: ScriptSchema, source: str) -> dict[str, set[str]]:
    """The schema tables `source` refers to, each with the names it reads from it."""
    used: dict[str, set[str]] = {}
    for match in LUA_REFERENCE.finditer(lua_code(source)):
        table, name = match.group(1), match.group(2)
        used.setdefault(table, set())
        if name is None:
            if table in LUA_TABLES or table == "R":
                raise SchemaMismatch(f"{script.name}.lua uses {table} other than as {table}.<name>")
            continue
        if table in (TERMINAL_TABLE, "REST"):
            raise SchemaMismatch(f"{script.name}.lua reads {table}.{name}: {table} has no names")
        used[table].add(name)
    return used


def _check_known(
    script: ScriptSchema, used: Mapping[str, set[str]], tables: Mapping[str, Mapping[str, object]]
) -> None:
    """SchemaMismatch for a name `script` uses that its tables do not have."""
    for table, names in used.items():
        unknown = sorted(names - set(tables[table])) if table in tables else []
        if unknown:
            listed = ", ".join(f"{table}.{name}" for name in unknown)
            raise SchemaMismatch(f"{script.name}.lua uses {listed}, not in the schema")
    if "REST" in used and not script.rest:
        raise SchemaMismatch(f"{script.name}.lua uses REST, but takes no ARGV after its names")
