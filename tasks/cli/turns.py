"""`agentjobs turn`: turn records. List them, show one, follow its events, cancel it; the
decisions a paused turn waits for are tasks/cli/decisions.py, registered on the same group.
Also how a turn's state reads in one phrase (`describe_state`), which listings share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
import orjson

from agent import AgentError, AgentRunCheckpoint
from tasks.cli import decisions
from tasks.cli.errors import Failure
from tasks.cli.options import STATE, by_identity, not_empty
from tasks.cli.output import (
    Column,
    format_table,
    human_s,
    plural,
    print_fields,
    print_json,
    terminal_width,
)
from tasks.core.errors import JobError
from tasks.core.schema import Field
from tasks.operate.control import cancel_turn
from tasks.operate.events import TurnEvent, iter_events
from tasks.operate.inspect import list_turns, pump_may_be_down, summary_of
from tasks.queue.context import JobContext, job_context
from tasks.store.dead_letters import iso_ms
from tasks.store.pending import pending_actions
from tasks.store.records import TurnRecord, TurnState


@click.group("turn")
def turn() -> None:
    """Turn records."""


for _decision in decisions.COMMANDS:
    turn.add_command(_decision)


def describe_state(record: dict[str, Any]) -> str:
    state = record.get("state", "?")
    if state == "running":
        return f"running at iteration {record.get('iteration') or 1}"
    if state == "waiting":
        due = record.get("dueAtMs")
        when = datetime.fromtimestamp(due / 1000, UTC).isoformat(timespec="seconds") if due else "?"
        return f"waiting for retry (attempt {record.get('attempt')}) until {when}"
    if state == "paused":
        return "paused: waiting for a person's decision (`agentjobs turn pending`)"
    if state == "cancelled":
        why = record.get("cancelReason")
        return f"cancelled: {why}" if why else "cancelled"
    if state == "dead_lettered":
        text = f"dead-lettered as {record.get('deadLetterId')} ({record.get('reason')})"
        if record.get("replayedAs"):
            text += f"; replayed as turn {record['replayedAs']}"
        return text
    return str(state)


def listed(summary: dict[str, Any]) -> dict[str, Any]:
    """A record's summary as listings print it: with its state in words."""
    return {**summary, "describe": describe_state(summary)}


@turn.command("show")
@click.argument("turn_id")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@by_identity
def turn_show(turn_id: str, as_json: bool, identity: dict[str, str] | None) -> None:
    """Show a turn's state: queued, running at iteration N, waiting for a retry, done."""
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None:
        kept = human_s(ctx.settings.record_ttl_s)
        raise Failure(
            f"no turn {turn_id!r}; finished turns are kept {kept} (AGENTJOBS_RECORD_TTL_S), "
            "`agentjobs turn list` shows those there are"
        )
    data = _shown(ctx, record)
    if as_json:
        print_json(data)
        return
    print_fields(_shown_rows(data))
    if record.replayed_as:
        click.echo(f"follow the replay with `agentjobs turn show {record.replayed_as}`")


def _shown(ctx: JobContext, record: TurnRecord) -> dict[str, Any]:
    """What `turn show` says of a record: the record, its progress, its state in words, the
    decisions it waits for and, for a waiting turn, whether its retry is overdue; then the
    message it was submitted with, the pause's times, and each time again as ISO 8601 UTC
    text (`createdAt` beside `createdAtMs`; None where the ms are None). While a turn is
    paused its deadline's clock stands still: `deadlineAtMs` is then the deadline from before
    the pause, and `deadlineLeftMs` what is left of it."""
    progress, unreadable = _progress_of(ctx, record)
    data = record.as_dict(progress)
    if unreadable:
        data["checkpointUnreadable"] = unreadable
    data["describe"] = describe_state(data)
    data["pending"] = [action.as_dict() for action in pending_actions(record)]
    if record.state == TurnState.WAITING:
        data["overdue"] = pump_may_be_down(ctx, record.due_at_ms)
    data.setdefault("message", _message_of(record.payload))
    data.setdefault("pausedAtMs", record.paused_at_ms or None)
    data.setdefault("pauseExpiresAtMs", record.pause_expires_at_ms or None)
    if record.state == TurnState.PAUSED:
        data.setdefault("deadlineLeftMs", _deadline_left_ms(ctx, record))
    for key in _TIMES:
        ms = data.get(f"{key}Ms")
        data.setdefault(key, iso_ms(ms) if isinstance(ms, int) and ms > 0 else None)
    return data


# The times `turn show` gives as ISO text, each beside its `<name>Ms` field.
_TIMES = (
    "createdAt",
    "updatedAt",
    "startedAt",
    "finishedAt",
    "dueAt",
    "firstFailedAt",
    "pausedAt",
    "pauseExpiresAt",
    "deadlineAt",
)


def _message_of(payload: Any) -> str | None:
    """The message a turn was submitted with, or None when its payload holds no text one."""
    message = payload.get("message") if isinstance(payload, dict) else None
    return message if isinstance(message, str) else None


def _deadline_left_ms(ctx: JobContext, record: TurnRecord) -> int | None:
    """How much of a paused turn's deadline is left: its clock stops while it is paused (the
    record's deadlineAtMs is set again when it resumes). None when it has no deadline."""
    key = ctx.keys.for_namespace(record.namespace).turn(record.turn_id)
    raw: Any = ctx.redis.hget(key, Field.DEADLINE_LEFT_MS)
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _time_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The turn's times as `turn show` prints them: ISO UTC, only those that apply to its
    state (the next retry while waiting, the pause's while paused)."""
    state = data["state"]
    shown = ["createdAt", "startedAt", "updatedAt", "finishedAt"]
    if state == TurnState.WAITING:
        shown.append("dueAt")
    if state == TurnState.PAUSED:
        shown += ["pausedAt", "pauseExpiresAt"]
    rows = [(_TIME_LABELS[key], data[key]) for key in shown if data.get(key)]
    left = data.get("deadlineLeftMs")
    if state == TurnState.PAUSED and data.get("deadlineAtMs"):
        # deadlineAtMs is stale while paused: what counts is the time left when it resumes.
        held = f"{human_s(left / 1000)} left" if isinstance(left, int) else "held"
        rows.append(("deadline", f"{held}, its clock stopped while paused"))
    elif data.get("deadlineAt"):
        rows.append(("deadline", data["deadlineAt"]))
    return rows


_TIME_LABELS = {
    "createdAt": "created",
    "startedAt": "started",
    "updatedAt": "updated",
    "finishedAt": "finished",
    "dueAt": "next retry due",
    "pausedAt": "paused at",
    "pauseExpiresAt": "pause expires",
}


def _shown_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("turn", data["turnId"]), ("state", data["describe"])]
    if data.get("overdue"):
        rows.append(("overdue", "its retry is due but no pump took it: is `agentjobs pump` up?"))
    for key in ("agent", "conversationId", "attempt", "deliveries", "worker", "lastError"):
        if data.get(key) not in (None, ""):
            rows.append((key, str(data[key])))
    rows += _time_rows(data)
    if data.get("message") is not None:
        rows.append(("message", _cut(data["message"], 200)))
    for action in data.get("pending") or []:
        asks = action["question"] or orjson.dumps(action["args"]).decode()
        rows.append(("pending", f"{action['requestId']}: {action['kind']} {action['tool']} {asks}"))
    if data.get("replayOf"):
        rows.append(("replayOf", str(data["replayOf"])))
    if data.get("checkpointUnreadable"):
        rows.append(("checkpoint", f"unreadable: {data['checkpointUnreadable']}"))
    if data.get("result"):
        rows.append(("result", orjson.dumps(data["result"]).decode()[:200]))
    return rows


def _cut(text: str, width: int) -> str:
    """`text` on one line, cut to `width` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _progress_of(ctx: JobContext, record: TurnRecord) -> tuple[AgentRunCheckpoint | None, str]:
    """The turn's progress and "", or None and why it cannot be read: a damaged checkpoint
    still lets the rest of the record show."""
    try:
        return ctx.records.progress(record), ""
    except (AgentError, JobError, ValueError, KeyError, TypeError) as exc:
        return None, str(exc)[:300]


# `turn watch` exit statuses: how the turn ended.
WATCH_EXIT = {"turn.succeeded": 0, "turn.dead_lettered": 3, "turn.cancelled": 4}


@turn.command("watch")
@click.argument("turn_id")
@click.option("--after", default=None, help="Start after this event id (to resume watching).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@by_identity
def turn_watch(
    turn_id: str, after: str | None, as_json: bool, identity: dict[str, str] | None
) -> None:
    """Print a turn's events as they happen, until it ends. Exit status: 0 succeeded,
    3 dead-lettered, 4 cancelled."""
    job_context()  # settings and Redis first: their failures read as such
    last = ""
    for event in iter_events(turn_id, after=after, identity=identity):
        last = event.type
        click.echo(_event_json(event) if as_json else _event_line(event))
    raise SystemExit(WATCH_EXIT.get(last, 0))


def _event_json(event: TurnEvent) -> str:
    line = {
        "id": event.id,
        "type": event.type,
        "turnId": event.turn_id,
        "attempt": event.attempt,
        "iteration": event.iteration,
        "at": event.at.isoformat(timespec="milliseconds"),
        "data": event.data,
    }
    return orjson.dumps(line).decode()


def _event_line(event: TurnEvent) -> str:
    detail = orjson.dumps(event.data).decode() if event.data else ""
    when = event.at.isoformat(timespec="milliseconds")
    return f"{when}  {event.type:20} attempt {event.attempt}  {detail}"[:200]


@turn.command("cancel")
@click.argument("turn_id")
@click.option("--reason", default="", help="Why (kept in the record and the event).")
@by_identity
def turn_cancel(turn_id: str, reason: str, identity: dict[str, str] | None) -> None:
    """Cancel an unfinished turn, whatever its state; the next turn of its conversation runs."""
    if cancel_turn(turn_id, reason=reason, identity=identity):
        click.echo(f"cancelled turn {turn_id}.")
        return
    record = job_context().records.find(turn_id, identity)
    if record is None:
        raise Failure(f"no turn {turn_id!r}; `agentjobs turn list` shows those there are")
    click.echo(f"turn {turn_id} had already ended ({record.state}); nothing to cancel.")


@turn.command("list")
@click.option("--state", type=STATE, default=None, help="Only turns in this state.")
@click.option("--conversation", default=None, callback=not_empty, help="Only this conversation id.")
@click.option("--agent", default=None, callback=not_empty, help="Only this agent.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of records.")
def turn_list(
    state: str | None, conversation: str | None, agent: str | None, limit: int, as_json: bool
) -> None:
    """List turns, newest first (finished ones while their records are kept)."""
    ctx = job_context()
    found = list_turns(ctx, state=state, conversation_id=conversation, agent=agent, limit=limit)
    shown = [listed(summary_of(r)) for r in found]
    if as_json:
        print_json(shown)
        return
    if not shown:
        kept = human_s(ctx.settings.record_ttl_s)
        click.echo(f"no turns match (finished turns are kept {kept}).")
        return
    now_ms = ctx.records.server_time_ms()
    columns = [
        Column("turn id"),
        Column("state", drop=5),
        Column("age", drop=4),
        Column("attempt", drop=1),
        Column("agent", drop=2),
        Column("conversation", flexible=True),
    ]
    rows = [
        [
            r["turnId"],
            r["state"],
            human_s(max(0, now_ms - r["createdAtMs"]) / 1000),
            str(r["attempt"]),
            r["agent"],
            r["conversationId"],
        ]
        for r in shown
    ]
    click.echo(format_table(columns, rows, terminal_width()))
    more = " (--limit shows more)" if len(shown) == limit else ""
    click.echo(f"{plural(len(shown), 'turn', 'turns')}, newest first{more}.")
