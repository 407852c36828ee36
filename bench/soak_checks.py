"""The chaos soak's checks (bench/soak.py runs them after every turn has ended).

Each check reads the finished run (turn records, Celery results, stored conversations, the
side-effect counter, the dead-letter store, the logs) and returns what it found wrong, with the
evidence; an empty list is a pass.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from agent import OUTCOME_UNKNOWN, AgentRunCheckpoint
from agent.journal import outcome_unknown_text
from agent.pauses import rejected_text
from agent.timeouts import timed_out_text
from bench import soak_agent as sa
from tasks.core.errors import TurnCancelled, TurnDeadLettered
from tasks.testing import redis_blob

TERMINAL = ("succeeded", "dead_lettered", "cancelled")
_LOGGED_END = re.compile(r"\[([0-9a-f-]{36})\] (succeeded in|raised expected: TurnDeadLettered)")


@dataclass(frozen=True)
class PlannedTurn:
    number: int
    conversation: str
    rounds: int
    refused: bool
    # The mixed soak's: the turn's tenant ("" for none), whether the canceller goes for it,
    # whether its first tool call hangs past its deadline.
    tenant: str = ""
    cancel: bool = False
    hang: bool = False
    # "approve", "reject" or "expire": what the soak's decider does with its first round's
    # approval ("" for a turn that asks for none).
    decision: str = ""
    slow: bool = False  # its first tool call outlasts its tool timeout

    @property
    def message(self) -> str:
        return sa.soak_message(
            self.number,
            self.conversation,
            self.rounds,
            self.refused,
            self.hang,
            bool(self.decision),
            self.slow,
        )

    @property
    def identity(self) -> dict[str, str] | None:
        return {"tenant": self.tenant} if self.tenant else None


@dataclass(frozen=True)
class Turn:
    """A planned turn, its task id and its record as the run left it."""

    plan: PlannedTurn
    task_id: str
    record: Mapping[str, str]

    def field(self, name: str) -> str:
        return self.record.get(name, "")

    def number(self, name: str) -> int:
        raw = self.record.get(name)
        return int(raw) if raw else 0

    @property
    def state(self) -> str:
        return self.field("state")


@dataclass
class Finding:
    name: str
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.problems.append(problem)


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[:limit] + "..."


def record_evidence(turn: Turn) -> str:
    keep = ("state", "attempt", "deliveries", "redeliveries", "iteration", "worker", "reason")
    shown = {name: turn.field(name) for name in keep if turn.field(name)}
    return f"turn {turn.plan.number} ({turn.task_id}) record {shown}"


# --- every turn ended exactly once -----------------------------------------------------------


def logged_ends(logs: Iterable[str]) -> dict[str, Counter[str]]:
    """task id -> how often a worker logged it as succeeded / raised TurnDeadLettered."""
    ends: dict[str, Counter[str]] = {}
    for text in logs:
        for task_id, what in _LOGGED_END.findall(text):
            ends.setdefault(task_id, Counter())[what.split()[0]] += 1
    return ends


def check_outcomes(turns: list[Turn], logs: list[str], cancelled: Iterable[str] = ()) -> Finding:
    """`cancelled`: the task ids cancel_turn reported as cancelled (the only ones that may,
    and must, end cancelled)."""
    finding = Finding("every turn ended exactly once, as expected")
    ends = logged_ends(logs)
    cancelled = set(cancelled)
    for turn in turns:
        state, reason = turn.state, turn.field("reason")
        if (state == "cancelled") != (turn.task_id in cancelled):
            said = "cancelled" if turn.task_id in cancelled else "not cancelled"
            finding.fail(f"cancel_turn said {said}: {record_evidence(turn)}")
        if state not in TERMINAL:
            finding.fail(f"not ended: {record_evidence(turn)}")
        elif state == "cancelled":
            pass
        elif turn.plan.hang and (state, reason) != ("dead_lettered", "deadline_exceeded"):
            finding.fail(f"a hung turn did not end deadline_exceeded: {record_evidence(turn)}")
        elif turn.plan.decision == "expire" and state == "succeeded":
            finding.fail(f"a turn left undecided succeeded: {record_evidence(turn)}")
        elif turn.plan.decision == "expire" and reason not in ("pause_expired", "max_attempts"):
            finding.fail(f"a turn left undecided ended {reason}: {record_evidence(turn)}")
        elif turn.plan.refused and (state, reason) != ("dead_lettered", "non_resumable"):
            finding.fail(f"a 401 turn did not end non_resumable: {record_evidence(turn)}")
        elif (
            not turn.plan.refused
            and not turn.plan.hang
            and turn.plan.decision != "expire"
            and state == "dead_lettered"
            and reason != "max_attempts"
        ):
            finding.fail(f"dead-lettered for an unexpected reason: {record_evidence(turn)}")
        if state in TERMINAL and not turn.field("finished_at_ms"):
            finding.fail(f"ended without finished_at_ms: {record_evidence(turn)}")
        if (state == "dead_lettered") != bool(turn.field("dlq_id")):
            finding.fail(f"dlq_id does not match the state: {record_evidence(turn)}")
        logged = ends.get(turn.task_id, Counter())
        if logged["succeeded"] + logged["raised"] > 1:
            finding.fail(f"logged as ended {dict(logged)} times: {record_evidence(turn)}")
        if (state == "succeeded" and logged["raised"]) or (
            state == "dead_lettered" and logged["succeeded"]
        ):
            finding.fail(f"logged as ended the other way {dict(logged)}: {record_evidence(turn)}")
    return finding


# --- Celery results --------------------------------------------------------------------------


def check_results(turns: list[Turn], app: Any, texts: list[str]) -> Finding:
    """AsyncResult sees what the record says; every result text goes into `texts` for the
    secrets sweep."""
    finding = Finding("Celery results match the turn records")
    for turn in turns:
        result = app.AsyncResult(turn.task_id)
        state = result.state
        try:
            value: Any = result.get(timeout=10)
        except TurnDeadLettered as exc:
            value = exc
        except Exception as exc:  # the check reports whatever else it got
            value = exc
        texts.append(f"{state} {value!r} {value}")
        if turn.state == "succeeded":
            expected = orjson.loads(turn.field("result"))
            if state != "SUCCESS" or value != expected:
                finding.fail(
                    f"{record_evidence(turn)}: result {state} {short(repr(value))}, "
                    f"record says {short(expected)}"
                )
        elif turn.state == "cancelled":
            if state != "REVOKED" and not isinstance(value, TurnCancelled):
                finding.fail(f"{record_evidence(turn)}: result {state} {short(repr(value))}")
        elif turn.state == "dead_lettered":
            ok = (
                isinstance(value, TurnDeadLettered)
                and value.reason == turn.field("reason")
                and value.entry_id == turn.field("dlq_id")
            )
            if state != "FAILURE" or not ok:
                finding.fail(f"{record_evidence(turn)}: result {state} {short(repr(value))}")
    return finding


# --- conversation histories ------------------------------------------------------------------


def expected_history(
    succeeded: list[PlannedTurn], unknown: Iterable[tuple[int, int]] = ()
) -> list[dict[str, Any]]:
    """The stored history of these turns; the rounds in `unknown` (an unsafe call interrupted
    by a kill) carry the `[outcome unknown]` text instead of the tool's result."""
    unknown = set(unknown)
    history: list[dict[str, Any]] = []
    for plan in succeeded:
        history.append({"role": "user", "content": plan.message})
        for round_ in range(1, plan.rounds + 1):
            name = sa.tool_name_for(plan.number, round_, bool(plan.decision), plan.slow)
            call_id = sa.tool_call_id(plan.number, round_)
            args = {"turn": plan.number, "round": round_}
            call = {"id": call_id, "name": name, "args": args}
            history.append({"role": "assistant", "content": "", "toolCalls": [call]})
            if (plan.number, round_) in unknown:
                content = outcome_unknown_text(name)
            elif plan.decision == "reject" and round_ == 1:
                content = rejected_text(sa.REJECTION)
            elif plan.slow and round_ == 1:
                content = timed_out_text(name, sa.SLOW_TIMEOUT_S)
            else:
                content = orjson.dumps(sa.effect_result(plan.number, round_)).decode()
            history.append(
                {"role": "tool", "content": content, "toolCallId": call_id, "toolName": name}
            )
        history.append({"role": "assistant", "content": sa.answer_for(plan.number)})
    return history


def first_difference(got: list[Any], expected: list[Any]) -> str:
    for index, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            return f"message {index}: stored {short(a, 200)}, expected {short(b, 200)}"
    return f"stored {len(got)} messages, expected {len(expected)}"


def unknown_rounds(history: Iterable[Mapping[str, Any]]) -> set[tuple[int, int]]:
    """(turn, round) of the tool messages that say `[outcome unknown]`."""
    found = set()
    for message in history:
        if message.get("role") == "tool" and str(message.get("content")).startswith(
            OUTCOME_UNKNOWN
        ):
            turn, _, round_ = str(message.get("toolCallId"))[1:].partition("r")
            found.add((int(turn), int(round_)))
    return found


def check_histories(
    turns: list[Turn],
    load: Any,
    may_be_unknown: Iterable[tuple[int, int]] = (),
) -> tuple[Finding, set[tuple[int, int]]]:
    """`load(conversation_id, identity)` -> AgentRunCheckpoint | None (tasks.load_conversation).
    `may_be_unknown`: the unsafe rounds in flight at a chaos event, the only ones whose tool
    message may say `[outcome unknown]`. Returns the finding and those that do."""
    finding = Finding("stored conversations are exactly their succeeded turns, in order")
    allowed = set(may_be_unknown)
    unknown: set[tuple[int, int]] = set()
    by_conversation: dict[str, list[Turn]] = {}
    for turn in sorted(turns, key=lambda t: t.plan.number):
        by_conversation.setdefault(turn.plan.conversation, []).append(turn)
    for conversation, members in sorted(by_conversation.items()):
        succeeded = [t.plan for t in members if t.state == "succeeded"]
        stored = load(conversation, members[0].plan.identity)
        got = list(stored.history) if stored is not None else []
        said_unknown = unknown_rounds(got) & allowed
        unknown |= said_unknown
        expected = expected_history(succeeded, said_unknown)
        if got != expected:
            finding.fail(f"conversation {conversation}: {first_difference(got, expected)}")
    return finding, unknown


# --- side effects ----------------------------------------------------------------------------


def read_effects(client: redis.Redis, prefix: str) -> dict[tuple[int, int], int]:
    raw: Any = client.hgetall(sa.effects_key(prefix))
    effects: dict[tuple[int, int], int] = {}
    for key, value in raw.items():
        turn, _, round_ = key.decode().partition(":")
        effects[(int(turn), int(round_))] = int(value)
    return effects


def mark_journaled(
    starts: Mapping[tuple[int, int], list[Start]], finished: Mapping[tuple[int, int], list[bool]]
) -> None:
    """Mark each start whose outcome was journaled, by position (finished_calls)."""
    for call, seen in starts.items():
        for start, journaled in zip(seen, finished.get(call, []), strict=False):
            start.journaled = journaled


def finished_calls(client: Any, events_key: str, turn: int) -> dict[tuple[int, int], list[bool]]:
    """For each (turn, round), its starts in order, each True when a tool.finished event (its
    outcome journaled, in the same step) followed it, in one turn's event stream."""
    calls: dict[tuple[int, int], list[bool]] = {}
    for _, fields in client.xrange(events_key):
        kind = fields.get(b"type")
        if kind not in (b"tool.started", b"tool.finished"):
            continue
        call_id = str(orjson.loads(fields[b"data"]).get("toolCallId", ""))
        _, _, round_ = call_id[1:].partition("r")
        if not round_.isdigit():
            continue
        seen = calls.setdefault((turn, int(round_)), [])
        if kind == b"tool.started":
            seen.append(False)
        elif seen:
            seen[-1] = True
    return calls


def read_starts(client: redis.Redis, prefix: str) -> dict[tuple[int, int], list[Start]]:
    starts: dict[tuple[int, int], list[Start]] = {}
    for raw in client.lrange(sa.starts_key(prefix), 0, -1):
        entry = orjson.loads(raw)
        calls = starts.setdefault((entry["turn"], entry["round"]), [])
        if entry.get("returned"):
            for start in calls:
                if start.attempt == entry["attempt"]:
                    start.returned = True
        else:
            calls.append(Start(entry["key"], entry["attempt"]))
    return starts


@dataclass
class Start:
    key: str
    attempt: int
    returned: bool = False  # the tool returned (its outcome may still not be journaled)
    journaled: bool = False  # its outcome was journaled (a tool.finished event for it)


@dataclass
class Repeats:
    """Tool calls started more than once, by why."""

    total: int = 0  # starts beyond the first, over all calls
    same_key: int = 0  # interrupted idempotent calls started again with their key
    after_outcome: int = 0  # completed calls (outcome journaled) started again: must stay 0
    # interrupted calls whose tool had returned, killed before the outcome was journaled
    after_return: int = 0
    unsafe: int = 0  # unsafe calls started more than once (must stay 0)


def check_side_effects(
    turns: list[Turn],
    effects: Mapping[tuple[int, int], int],
    in_flight: Mapping[tuple[int, int], list[str]],
    starts: Mapping[tuple[int, int], list[Start]] | None = None,
    unknown: Iterable[tuple[int, int]] = (),
) -> tuple[Finding, Repeats]:
    """Returns the finding and the repeated starts, by why.

    `in_flight` maps (turn, round) to the chaos events (kills, the Redis restart) at which that
    round was the iteration in flight: the only rounds allowed to run more than once, once more
    per event. With `starts` (each start's key and attempt, whether it returned and whether its
    outcome was journaled), a call starts again only with its own key, never after an earlier
    start's outcome was journaled (that call completed; a start that returned but was killed
    before its outcome was journaled is an interrupted one, counted apart), never
    when its tool is unsafe. An unsafe call in `unknown` (its tool
    message says `[outcome unknown]`) may never have reached its tool: its worker died right
    after the call's start was journaled.
    """
    unknown = set(unknown)
    finding = Finding("side effects repeated only in iterations in flight at a kill or restart")
    by_number = {t.plan.number: t for t in turns}
    repeats = Repeats()
    for (number, round_), seen in sorted((starts or {}).items()):
        if len(seen) < 2:
            continue
        where = f"turn {number} round {round_}"
        if len({s.key for s in seen}) > 1:
            finding.fail(f"{where} started with {len({s.key for s in seen})} different keys")
        if [s.attempt for s in seen] != list(range(1, len(seen) + 1)):
            finding.fail(f"{where} started with attempts {[s.attempt for s in seen]}")
        if sa.is_unsafe_turn(number):
            repeats.unsafe += len(seen) - 1
            finding.fail(f"{where}: an unsafe call started {len(seen)} times")
        completed = sum(1 for s in seen[:-1] if s.journaled)
        repeats.after_outcome += completed
        if completed:
            finding.fail(f"{where} started again after its outcome was journaled")
        repeats.after_return += sum(1 for s in seen[:-1] if s.returned and not s.journaled)
        repeats.same_key += len(seen) - 1
    for (number, round_), count in sorted(effects.items()):
        turn = by_number.get(number)
        if turn is None:
            finding.fail(f"effect of an unknown turn {number} round {round_}")
            continue
        most = 1 if turn.plan.refused else turn.plan.rounds
        if round_ > most:
            finding.fail(f"round {round_} ran but at most {most} exist: {record_evidence(turn)}")
        repeats.total += count - 1
        allowed = 1 + len(in_flight.get((number, round_), []))
        if count > allowed:
            events = in_flight.get((number, round_), [])
            finding.fail(
                f"round {round_} ran {count} times, in flight at {events or 'no chaos event'}: "
                f"{record_evidence(turn)}"
            )
    for turn in turns:
        if turn.state == "succeeded":
            for round_ in range(1, turn.plan.rounds + 1):
                if (turn.plan.number, round_) in unknown:
                    continue
                if turn.plan.decision == "reject" and round_ == 1:
                    if effects.get((turn.plan.number, round_), 0):
                        finding.fail(f"a rejected call ran: {record_evidence(turn)}")
                    continue
                if effects.get((turn.plan.number, round_), 0) < 1:
                    finding.fail(f"round {round_} never ran: {record_evidence(turn)}")
    return finding, repeats


# --- dead letters ----------------------------------------------------------------------------


def check_dead_letters(
    turns: list[Turn], entries: list[dict[str, Any]], max_attempts: int
) -> Finding:
    finding = Finding("dead letters are exactly the 401 turns and the exhausted ones")
    if any(t.plan.hang for t in turns):
        finding.name = "dead letters are exactly the 401, the hung and the exhausted turns"
    by_task = Counter(str(e.get("taskId")) for e in entries)
    for task_id, count in by_task.items():
        if count > 1:
            finding.fail(f"{count} entries for turn {task_id}")
    entry_of = {str(e.get("taskId")): e for e in entries}
    dead = {t.task_id for t in turns if t.state == "dead_lettered"}
    for task_id in sorted(set(entry_of) - dead):
        finding.fail(f"entry for a turn that is not dead-lettered: {short(entry_of[task_id])}")
    for turn in turns:
        if turn.task_id in dead:
            entry = entry_of.get(turn.task_id)
            if entry is None:
                finding.fail(f"no entry: {record_evidence(turn)}")
            else:
                finding.problems += entry_problems(turn, entry, max_attempts)
    return finding


def entry_problems(turn: Turn, entry: dict[str, Any], max_attempts: int) -> list[str]:
    problems: list[str] = []
    where = record_evidence(turn)
    error = str(entry.get("error", ""))
    if entry.get("id") != turn.field("dlq_id") or entry.get("reason") != turn.field("reason"):
        problems.append(f"entry {entry.get('id')} ({entry.get('reason')}) != {where}")
    if turn.plan.decision == "expire" and entry.get("reason") == "pause_expired":
        pass
    elif turn.plan.hang:
        if entry.get("reason") != "deadline_exceeded":
            problems.append(f"a hung turn's entry is {entry.get('reason')}: {where}")
    elif turn.plan.refused:
        if "HTTP 401" not in error or entry.get("errorType") != "ProviderHTTPError":
            problems.append(f"401 turn's entry error {short(error)}: {where}")
    else:
        if turn.number("attempt") != max_attempts or entry.get("attempts") != max_attempts:
            problems.append(f"max_attempts after {entry.get('attempts')} attempts: {where}")
        for what, text in (("entry error", error), ("last_error", turn.field("last_error"))):
            if "HTTP 503" not in text and "HTTP 429" not in text:
                problems.append(f"{what} is not a 503/429: {short(text)}: {where}")
    # A hung turn may have ended before any of its iterations was persisted: nothing to resume.
    if not ((turn.plan.hang or turn.plan.decision) and entry.get("checkpoint") is None):
        problems += checkpoint_problems(turn, entry.get("checkpoint"))
    return problems


def checkpoint_problems(turn: Turn, wire: Any) -> list[str]:
    """The last good checkpoint of a dead-lettered turn reads back and holds its message."""
    try:
        checkpoint = AgentRunCheckpoint.from_json(orjson.dumps(wire))
    except Exception as exc:
        return [f"entry checkpoint unreadable ({exc}): {record_evidence(turn)}"]
    users = [m.get("content") for m in checkpoint.history if m.get("role") == "user"]
    if not users or users[-1] != turn.plan.message:
        return [f"entry checkpoint does not end on the turn's message: {record_evidence(turn)}"]
    return []


# --- secrets ---------------------------------------------------------------------------------


def check_secrets(
    secrets: list[str],
    client: redis.Redis,
    entries: list[dict[str, Any]],
    result_texts: list[str],
    files: list[Path],
) -> Finding:
    finding = Finding("no API key or endpoint host in Redis, its AOF, dead letters, results, logs")
    places: dict[str, bytes] = {
        "redis": redis_blob(client),
        "dead letters": orjson.dumps(entries),
        "celery results": "\n".join(result_texts).encode(),
    }
    for path in files:
        places[path.name] = path.read_bytes() if path.exists() else b""
    for secret in secrets:
        for place, blob in places.items():
            if secret.encode() in blob:
                at = blob.index(secret.encode())
                context = blob[max(0, at - 120) : at + 80].decode(errors="replace")
                finding.fail(f"{secret!r} found in {place}: ...{short(context)}")
    if b"[redacted" not in places["dead letters"]:
        finding.fail("no redacted text in the dead letters: the sweep saw no fault text at all")
    return finding
