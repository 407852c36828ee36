"""The `agentjobs` command: what an operator needs to see and steer the job system.

    agentjobs --version
    agentjobs stats [--json]
    agentjobs turn list [--state S] [--conversation C] [--agent A] [--limit N] [--json]
    agentjobs turn show TURN_ID [--json]
    agentjobs conversation show ID [--tenant T] [--principal P] [--json]
    agentjobs dlq list [--reason R] [--json]
    agentjobs dlq show ID [--json]
    agentjobs dlq replay ID | --all [--reason R]
    agentjobs dlq purge --reason R | --older-than DURATION | --all [--yes]
    agentjobs pump
    agentjobs metrics [--port 9808] [--host 0.0.0.0]
    agentjobs demo

An expected failure (Redis unreachable, a bad setting, an unknown id, a bad argument) is one line
on stderr and a non-zero exit status, for every command at once (tasks/cli/errors.py).
"""

from __future__ import annotations

import functools
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tasks.cli.errors import AgentjobsGroup, Failure
from tasks.core.errors import Reason
from tasks.store.dead_letters import UNREADABLE, ReplayError, UnreadableEntry
from tasks.store.records import TurnState

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
REASON = click.Choice([str(r) for r in Reason])
STATE = click.Choice([str(s) for s in TurnState])


def parse_duration_s(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d', '1w' -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 2h or 7d")
    return float(match[1]) * _UNIT_S[match[2]]


class Duration(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        seconds = parse_duration_s(str(value))
        if seconds <= 0:
            self.fail(f"{value!r} is not longer than nothing; --all deletes every entry")
        return seconds


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty; leave the option out to match any")
    return value


_Command = TypeVar("_Command", bound=Callable[..., Any])


def _by_identity(command: _Command) -> _Command:
    """--tenant/--principal on a by-id command, passed as `identity`: with either, a turn of
    another tenant or principal is treated as unknown (docs/platform.md, "By-id calls and
    identity"); with neither, the turn id alone decides."""

    @functools.wraps(command)
    def run(*args: Any, tenant: str | None, principal: str | None, **kwargs: Any) -> Any:
        identity = {k: v for k, v in (("tenant", tenant), ("principal", principal)) if v}
        return command(*args, identity=identity or None, **kwargs)

    run = click.option(
        "--principal", default=None, callback=_not_empty, help="Only a turn of this principal."
    )(run)
    run = click.option(
        "--tenant", default=None, callback=_not_empty, help="Only a turn of this tenant."
    )(run)
    return run  # type: ignore[return-value]


# ---- output --------------------------------------------------------------------------------


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _stream_json_array(items: Iterator[Any]) -> None:
    """A JSON array written item by item: a large store is never held in memory at once."""
    out = sys.stdout
    out.write("[")
    for n, item in enumerate(items):
        out.write(("," if n else "") + "\n" + orjson.dumps(item).decode())
    out.write("\n]\n")


def _console() -> Console:
    # Literal: what it prints holds text of models, tools and people ("[/bold]", ":x:").
    return Console(highlight=False, markup=False, emoji=False, width=_width())


def _print_fields(rows: Iterable[tuple[str, str]]) -> None:
    """A two-column table of fields and values, each cell Text: a value such as a reply
    holding `[/bold]` or a `[redacted-url]` placeholder prints as it is, never as markup."""
    table = Table("field", "value", show_header=False)
    for field, value in rows:
        table.add_row(Text(field), Text(value))
    _console().print(table)


def _width() -> int:
    # COLUMNS, else the terminal's, else (a pipe, a log) wide enough for ids and errors.
    return shutil.get_terminal_size((200, 24)).columns


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def human_s(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{seconds:.1f} s"


@dataclass(frozen=True)
class Column:
    header: str
    # 0: always shown in full (ids); otherwise dropped when the width runs out, lowest first.
    drop: int = 0
    # Cut to the width the other columns leave (at least MIN_FLEXIBLE), dropped last.
    flexible: bool = False


MIN_FLEXIBLE = 16
GAP = "  "


def format_table(columns: list[Column], rows: list[list[str]], width: int) -> str:
    """A plain table within `width`: the flexible column is cut first, then columns are
    dropped by priority; a `drop=0` column is never cut."""
    natural = [max([len(c.header)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    while True:
        fixed = sum(natural[i] for i in shown if not columns[i].flexible)
        flexible = [i for i in shown if columns[i].flexible]
        left = width - fixed - len(GAP) * (len(shown) - 1)
        if left >= MIN_FLEXIBLE * len(flexible) and left >= 0:
            break
        droppable = sorted((columns[i].drop, i) for i in shown if columns[i].drop > 0)
        if droppable:
            shown.remove(droppable[0][1])
        elif flexible:
            shown.remove(flexible[-1])
        else:
            break  # only the columns shown in full are left: wider than asked, never cut
    widths = {i: natural[i] for i in shown}
    for i in flexible:
        widths[i] = min(natural[i], left // len(flexible))

    def line(cells: list[str]) -> str:
        out = []
        for i in shown:
            cell = cells[i]
            if len(cell) > widths[i]:
                cell = cell[: widths[i] - 1] + "…"
            out.append(cell.ljust(widths[i]))
        return GAP.join(out).rstrip()

    return "\n".join([line([c.header for c in columns]), *(line(r) for r in rows)])


def _when(iso: str) -> str:
    return iso[:19].replace("T", " ")


def _context() -> Any:
    from tasks.queue.context import job_context

    return job_context()


# ---- commands ------------------------------------------------------------------------------


@click.group(cls=AgentjobsGroup, name="agentjobs")
@click.version_option(
    package_name="agentjobs", prog_name="agentjobs", message="%(prog)s %(version)s"
)
def main() -> None:
    """agentjobs: durable agent turns on Celery."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def stats(as_json: bool) -> None:
    """Turns by state, dead letters by reason, retries due, the oldest runnable turn's age and
    the pump's last heartbeat."""
    from tasks.operate.inspect import OVERDUE_PUMP_INTERVALS
    from tasks.operate.inspect import stats as read_stats

    ctx = _context()
    figures = read_stats(ctx)
    if as_json:
        _print_json(figures)
        return
    turns = figures["turns"]
    click.echo("turns          " + "  ".join(f"{state} {n}" for state, n in turns.items()))
    kept = human_s(ctx.settings.record_ttl_s)
    click.echo(f"               (finished: records kept {kept}, AGENTJOBS_RECORD_TTL_S)")
    dead = figures["deadLetters"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in dead["byReason"].items())
    click.echo(f"dead letters   {dead['total']}" + (f": {reasons}" if reasons else ""))
    due = figures["retriesDueNow"]
    oldest_due = figures["oldestDueRetryAgeS"]
    since = f" (the oldest was due {human_s(oldest_due)} ago)" if oldest_due is not None else ""
    click.echo(f"retries due    {due}{since}")
    oldest = figures["oldestQueuedAgeS"]
    click.echo("oldest queued  " + (f"{human_s(oldest)} ago" if oldest is not None else "-"))
    runnable = figures["oldestRunnableAgeS"]
    click.echo(
        "runnable for   "
        + (f"{human_s(runnable)} (the longest a turn has waited for a worker)" if runnable else "-")
    )
    pump = figures["pump"]
    beat = pump["lastHeartbeatAgeS"]
    click.echo(
        "pump           "
        + (
            f"last tick {human_s(beat)} ago"
            if beat is not None
            else "no heartbeat (no pump has run in AGENTJOBS_RECORD_TTL_S)"
        )
    )
    _echo_state(figures["state"])
    unreadable = figures["unreadableRecords"]
    if unreadable["total"]:
        click.echo(
            f"unreadable     {_plural(unreadable['total'], 'turn record', 'turn records')} "
            f"skipped by the pump and listings: {', '.join(unreadable['turnIds'])}"
        )
    if figures["retriesOverdue"] and pump["mayBeDown"]:
        late_s = OVERDUE_PUMP_INTERVALS * ctx.settings.pump_interval_s
        click.echo(
            f"overdue        {_plural(figures['retriesOverdue'], 'waiting turn', 'waiting turns')}"
            f" due more than {human_s(late_s)} ago: the pump may be down; start it with "
            "`agentjobs pump`"
        )


def _at_s(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


def _echo_state(state: dict[str, Any]) -> None:
    """The state store's lines of `stats`: its epoch, and plainly, any loss on record."""
    epoch = state["epoch"] or {}
    since = _at_s(int(epoch.get("createdAtMs", 0))) if epoch else "-"
    click.echo(f"state store    {state['store']}, epoch {epoch.get('id', '-')} since {since}")
    for loss in state["losses"]:
        click.echo(
            f"STATE LOST     the store lost its data: epoch {loss['lostEpoch']} was replaced by "
            f"{loss['epoch']} (noticed {_at_s(int(loss['detectedAtMs']))} by "
            f"{loss['detectedBy'] or 'a process'}); turns from before it are gone"
        )
    if state["stateLostTurns"]:
        click.echo(
            f"STATE LOST     {_plural(state['stateLostTurns'], 'turn', 'turns')} dead-lettered "
            "as state_lost: `agentjobs dlq list --reason state_lost`"
        )


@main.group()
def dlq() -> None:
    """The dead-letter store."""


@dlq.command("list")
@click.option("--reason", type=REASON, default=None, help="Only entries with this reason.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of entries.")
def dlq_list(reason: str | None, as_json: bool) -> None:
    """List dead-lettered turns, oldest first."""
    store = _context().dead_letters
    if as_json:
        _stream_json_array(store.iter_entries(reason=reason, bodies=True))
    else:
        print_dead_letters(store.list_entries(reason=reason))


def _entry_row(entry: dict[str, Any]) -> list[str]:
    if UNREADABLE in entry:
        return [entry["id"], "unreadable", "-", "-", "-", "-", str(entry[UNREADABLE])]
    return [
        entry["id"],
        entry["reason"],
        str(entry.get("attempts", "-")),
        str(entry.get("agent", "-")),
        str(entry.get("conversationId", "-")),
        _when(entry["lastFailedAt"]),
        f"{entry.get('errorType', '?')}: {entry.get('error', '')}",
    ]


def print_dead_letters(entries: list[dict[str, Any]]) -> None:
    if not entries:
        click.echo("The dead-letter store is empty.")
        return
    columns = [
        Column("id"),
        Column("reason"),
        Column("attempts", drop=5),
        Column("agent", drop=2),
        Column("conversation", drop=1),
        Column("last failed", drop=3),
        Column("error", flexible=True),
    ]
    click.echo(format_table(columns, [_entry_row(e) for e in entries], _width()))
    unreadable = sum(1 for e in entries if UNREADABLE in e)
    broken = f", {unreadable} unreadable (replay skips them)" if unreadable else ""
    click.echo(f"{_plural(len(entries), 'entry', 'entries')}{broken}.")
    click.echo("`agentjobs dlq show ID` shows one; `agentjobs dlq replay ID` runs it again.")


@dlq.command("show")
@click.argument("entry_id")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as one JSON object.")
def dlq_show(entry_id: str, as_json: bool) -> None:
    """Show one dead-letter entry, its checkpoint included."""
    entry = _context().dead_letters.get(entry_id)
    if entry is None:
        raise Failure(f"no dead-letter entry {entry_id!r}; `agentjobs dlq list` shows them")
    if UNREADABLE in entry:
        raise UnreadableEntry(entry_id, entry[UNREADABLE])
    if as_json:
        _print_json(entry)
        return
    rows = [(k, str(v)) for k, v in entry.items() if k not in ("checkpoint", "kwargs")]
    checkpoint = entry.get("checkpoint") or {}
    history = checkpoint.get("history") or []
    rows.append(("checkpoint", f"{len(history)} messages, runId {checkpoint.get('runId', '-')}"))
    rows.append(("kwargs", orjson.dumps(entry.get("kwargs")).decode()[:200]))
    _print_fields(rows)


@dlq.command("replay")
@click.argument("entry_id", required=False)
@click.option("--all", "every", is_flag=True, help="Replay every entry (of --reason, if given).")
@click.option("--reason", type=REASON, default=None, help="With --all: only this reason.")
def dlq_replay(entry_id: str | None, every: bool, reason: str | None) -> None:
    """Enqueue dead-lettered turns again, each as a new turn with a fresh retry budget: one
    entry by ID, or --all of them (--reason R --all: those with that reason)."""
    if entry_id is not None and (every or reason):
        raise click.UsageError("give an entry ID or --all [--reason R], not both")
    if entry_id is None and not every:
        hint = f"add --all to replay every {reason} entry" if reason else "give an entry ID"
        raise click.UsageError(f"say what to replay: {hint}, or --all for every entry")
    store = _context().dead_letters
    if entry_id is not None:
        replayed = store.replay(entry_id)
        _echo_replayed(entry_id, replayed)
        click.echo(f"follow it with `agentjobs turn show {replayed.turn_id}`")
        return
    entries = store.list_entries(reason=reason)
    if not entries:
        which = f" with reason {reason}" if reason else ""
        click.echo(f"no dead-letter entries{which}; nothing replayed.")
        return
    new_ids, skipped = _replay_each(store, entries)
    if len(entries) > 1:
        click.echo(f"{_plural(len(new_ids), 'entry', 'entries')} replayed.")
    if new_ids:
        click.echo(
            f"follow it with `agentjobs turn show {new_ids[0]}`"
            if len(new_ids) == 1
            else "follow each with `agentjobs turn show NEW_ID`, or all with `agentjobs turn list`"
        )
    if skipped:
        raise Failure(
            f"skipped {_plural(len(skipped), 'entry', 'entries')} it could not replay: "
            f"{', '.join(skipped)}; they stay in the store (`agentjobs dlq show ID` says why)"
        )


def _replay_each(store: Any, entries: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Replay every entry that can be; one that cannot (unreadable, or gone since the list
    was read) is named and skipped, so one damaged entry holds none of the others back.
    Returns (the new turn ids, the entry ids skipped)."""
    new_ids: list[str] = []
    skipped: list[str] = []
    for entry in entries:
        one = entry["id"]
        try:
            if UNREADABLE in entry:
                raise UnreadableEntry(one, entry[UNREADABLE])
            replayed = store.replay(one)
        except ReplayError as exc:
            why = exc.problem if isinstance(exc, UnreadableEntry) else str(exc).split(";")[0]
            click.echo(f"skipped {one}: {why}.")
            skipped.append(one)
            continue
        _echo_replayed(one, replayed)
        new_ids.append(replayed.turn_id)
    return new_ids, skipped


def _echo_replayed(entry_id: str, replayed: Any) -> None:
    if not replayed.first:
        click.echo(f"{entry_id} was already replayed as turn {replayed.turn_id}; not run again.")
        return
    how = "resuming its checkpoint" if replayed.resumed_from_checkpoint else "from its message"
    click.echo(f"replayed {entry_id} as turn {replayed.turn_id} ({how}).")


@dlq.command("purge")
@click.option("--reason", type=REASON, default=None, help="Entries with this reason.")
@click.option("--older-than", "older_than_s", type=Duration(), help="Entries older, e.g. 7d.")
@click.option("--all", "every", is_flag=True, help="Every entry.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(reason: str | None, older_than_s: float | None, every: bool, yes: bool) -> None:
    """Delete dead-letter entries: those of --reason, --older-than, both, or --all."""
    if every and (reason or older_than_s is not None):
        raise click.UsageError("--all deletes every entry: leave out --reason and --older-than")
    if not every and reason is None and older_than_s is None:
        raise click.UsageError(
            "say which entries to delete: --reason R, --older-than 7d (or both), or --all"
        )
    # Nobody at a terminal to answer (a script, a cron job, a pipe): deleting needs --yes.
    if not yes and not sys.stdin.isatty():
        raise Failure(
            "dlq purge deletes only what it was told to: stdin is not a terminal, so pass "
            "--yes to delete the matching entries without asking"
        )
    store = _context().dead_letters
    # The entries counted in the question are the ones deleted, whatever is filed meanwhile.
    doomed = store.purgeable(reason=reason, older_than_s=older_than_s)
    if doomed and not yes:
        count = _plural(len(doomed), "dead-letter entry", "dead-letter entries")
        if not click.confirm(f"Delete {count}{_purge_filter(reason, older_than_s)}?"):
            raise Failure("not confirmed; nothing deleted")
    removed = store.remove(doomed)
    click.echo(f"purged {_plural(removed, 'entry', 'entries')}.")


def _purge_filter(reason: str | None, older_than_s: float | None) -> str:
    which = [f"reason {reason}"] if reason else []
    if older_than_s is not None:
        which.append(f"failed more than {human_s(older_than_s)} ago")
    return f" ({', '.join(which)})" if which else " (all of them)"


@main.group()
def turn() -> None:
    """Turn records."""


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


def _listed(summary: dict[str, Any]) -> dict[str, Any]:
    return {**summary, "describe": describe_state(summary)}


@turn.command("show")
@click.argument("turn_id")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@_by_identity
def turn_show(turn_id: str, as_json: bool, identity: dict[str, str] | None) -> None:
    """Show a turn's state: queued, running at iteration N, waiting for a retry, done."""
    from tasks.operate.inspect import pump_may_be_down

    ctx = _context()
    record = ctx.records.find(turn_id, identity)
    if record is None:
        kept = human_s(ctx.settings.record_ttl_s)
        raise Failure(
            f"no turn {turn_id!r}; finished turns are kept {kept} (AGENTJOBS_RECORD_TTL_S), "
            "`agentjobs turn list` shows those there are"
        )
    from tasks.operate.people import pending_actions

    progress, unreadable = _progress_of(ctx, record)
    data = record.as_dict(progress)
    if unreadable:
        data["checkpointUnreadable"] = unreadable
    data["describe"] = describe_state(data)
    data["pending"] = [action.as_dict() for action in pending_actions(record)]
    if record.state == TurnState.WAITING:
        data["overdue"] = pump_may_be_down(ctx, record.due_at_ms)
    if as_json:
        _print_json(data)
        return
    rows = [("state", data["describe"])]
    if data.get("overdue"):
        rows.append(("overdue", "its retry is due but no pump took it: is `agentjobs pump` up?"))
    for key in ("agent", "conversationId", "attempt", "deliveries", "worker", "lastError"):
        if data.get(key) not in (None, ""):
            rows.append((key, str(data[key])))
    for action in data.get("pending") or []:
        asks = action["question"] or orjson.dumps(action["args"]).decode()
        rows.append(("pending", f"{action['requestId']}: {action['kind']} {action['tool']} {asks}"))
    if data.get("replayOf"):
        rows.append(("replayOf", str(data["replayOf"])))
    if unreadable:
        rows.append(("checkpoint", f"unreadable: {unreadable}"))
    if data.get("result"):
        rows.append(("result", orjson.dumps(data["result"]).decode()[:200]))
    _print_fields(rows)
    if record.replayed_as:
        click.echo(f"follow the replay with `agentjobs turn show {record.replayed_as}`")


def _progress_of(ctx: Any, record: Any) -> tuple[Any, str]:
    """The turn's progress and "", or None and why it cannot be read: a damaged checkpoint
    still lets the rest of the record show."""
    from agent import AgentError
    from tasks.core.errors import JobError

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
@_by_identity
def turn_watch(
    turn_id: str, after: str | None, as_json: bool, identity: dict[str, str] | None
) -> None:
    """Print a turn's events as they happen, until it ends. Exit status: 0 succeeded,
    3 dead-lettered, 4 cancelled."""
    from tasks.operate.events import iter_events

    _context()  # settings and Redis first: their failures read as such
    last = ""
    for event in iter_events(turn_id, after=after, identity=identity):
        last = event.type
        if as_json:
            line = {
                "id": event.id,
                "type": event.type,
                "turnId": event.turn_id,
                "attempt": event.attempt,
                "iteration": event.iteration,
                "at": event.at.isoformat(timespec="milliseconds"),
                "data": event.data,
            }
            click.echo(orjson.dumps(line).decode())
        else:
            detail = orjson.dumps(event.data).decode() if event.data else ""
            when = event.at.isoformat(timespec="milliseconds")
            click.echo(f"{when}  {event.type:20} attempt {event.attempt}  {detail}"[:200])
    raise SystemExit(WATCH_EXIT.get(last, 0))


@turn.command("cancel")
@click.argument("turn_id")
@click.option("--reason", default="", help="Why (kept in the record and the event).")
@_by_identity
def turn_cancel(turn_id: str, reason: str, identity: dict[str, str] | None) -> None:
    """Cancel an unfinished turn, whatever its state; the next turn of its conversation runs."""
    from tasks.operate.control import cancel_turn

    if cancel_turn(turn_id, reason=reason, identity=identity):
        click.echo(f"cancelled turn {turn_id}.")
        return
    record = _context().records.find(turn_id, identity)
    if record is None:
        raise Failure(f"no turn {turn_id!r}; `agentjobs turn list` shows those there are")
    click.echo(f"turn {turn_id} had already ended ({record.state}); nothing to cancel.")


@turn.command("pending")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of paused turns.")
def turn_pending(as_json: bool) -> None:
    """List the paused turns and the decisions each waits for, soonest to expire first."""
    from tasks.operate.people import paused_turns

    ctx = _context()
    found: list[dict[str, Any]] = [
        {
            "turnId": record.turn_id,
            "agent": record.agent,
            "conversationId": record.conversation_id,
            "pending": [action.as_dict() for action in actions],
        }
        for record, actions in paused_turns(ctx)
    ]
    if as_json:
        _print_json(found)
        return
    if not found:
        click.echo("no turn is waiting for a decision.")
        return
    columns = [
        Column("turn id"),
        Column("request id"),
        Column("kind", drop=2),
        Column("tool", drop=3),
        Column("expires", drop=1),
        Column("asks", flexible=True),
    ]
    rows = [
        [
            turn["turnId"],
            action["requestId"],
            action["kind"],
            action["tool"],
            _when(action["expiresAt"]),
            action["question"] or orjson.dumps(action["args"]).decode(),
        ]
        for turn in found
        for action in turn["pending"]
    ]
    click.echo(format_table(columns, rows, _width()))
    actions = sum(len(turn["pending"]) for turn in found)
    click.echo(
        f"{_plural(len(found), 'paused turn', 'paused turns')}, "
        f"{_plural(actions, 'decision', 'decisions')} to make: `agentjobs turn approve|reject|"
        "answer TURN_ID REQUEST_ID`."
    )


def _decided(turn_id: str, request_id: str, recorded: bool, what: str) -> None:
    if recorded:
        click.echo(f"{what} request {request_id} of turn {turn_id}.")
    else:
        click.echo(f"request {request_id} of turn {turn_id} was already decided so; no change.")


def _json_args(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object of the tool's arguments")
    return parsed


@turn.command("approve")
@click.argument("turn_id")
@click.argument("request_id")
@click.option(
    "--args",
    "edited_args",
    callback=_json_args,
    default=None,
    help="The call's arguments to run instead of the model's, as a JSON object.",
)
@click.option("--actor", default="", help="Who decides (kept in the record and the event).")
@_by_identity
def turn_approve(
    turn_id: str, request_id: str, edited_args: Any, actor: str, identity: dict[str, str] | None
) -> None:
    """Approve a paused turn's tool call; the turn resumes once all its requests are decided."""
    from tasks.operate.people import approve_action

    _context()
    recorded = approve_action(
        turn_id, request_id, edited_args=edited_args, actor=actor, identity=identity
    )
    _decided(turn_id, request_id, recorded, "approved")


@turn.command("reject")
@click.argument("turn_id")
@click.argument("request_id")
@click.option("--message", default="", help="What the model is told ([rejected] <message>).")
@click.option("--actor", default="", help="Who decides (kept in the record and the event).")
@_by_identity
def turn_reject(
    turn_id: str, request_id: str, message: str, actor: str, identity: dict[str, str] | None
) -> None:
    """Reject a paused turn's tool call: it does not run, and the model is told why."""
    from tasks.operate.people import reject_action

    _context()
    recorded = reject_action(turn_id, request_id, message=message, actor=actor, identity=identity)
    _decided(turn_id, request_id, recorded, "rejected")


@turn.command("answer")
@click.argument("turn_id")
@click.argument("request_id")
@click.argument("text")
@click.option("--actor", default="", help="Who answers (kept in the record and the event).")
@_by_identity
def turn_answer(
    turn_id: str, request_id: str, text: str, actor: str, identity: dict[str, str] | None
) -> None:
    """Answer a paused turn's question: the text is the ask_user call's result, verbatim."""
    from tasks.operate.people import answer_question

    _context()
    recorded = answer_question(turn_id, request_id, text, actor=actor, identity=identity)
    _decided(turn_id, request_id, recorded, "answered")


@turn.command("list")
@click.option("--state", type=STATE, default=None, help="Only turns in this state.")
@click.option(
    "--conversation", default=None, callback=_not_empty, help="Only this conversation id."
)
@click.option("--agent", default=None, callback=_not_empty, help="Only this agent.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of records.")
def turn_list(
    state: str | None, conversation: str | None, agent: str | None, limit: int, as_json: bool
) -> None:
    """List turns, newest first (finished ones while their records are kept)."""
    from tasks.operate.inspect import list_turns, summary_of

    ctx = _context()
    found = list_turns(ctx, state=state, conversation_id=conversation, agent=agent, limit=limit)
    listed = [_listed(summary_of(r)) for r in found]
    if as_json:
        _print_json(listed)
        return
    if not listed:
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
        for r in listed
    ]
    click.echo(format_table(columns, rows, _width()))
    more = " (--limit shows more)" if len(listed) == limit else ""
    click.echo(f"{_plural(len(listed), 'turn', 'turns')}, newest first{more}.")


@main.group()
def conversation() -> None:
    """Stored conversations."""


def _message_line(message: dict[str, Any], width: int = 100) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else orjson.dumps(content).decode()
    if not text and message.get("toolCalls"):
        names = [str(call.get("name", "?")) for call in message["toolCalls"]]
        text = f"[calls {', '.join(names)}]"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@conversation.command("show")
@click.argument("conversation_id")
@click.option("--tenant", default=None, callback=_not_empty, help="The identity's tenant.")
@click.option("--principal", default=None, callback=_not_empty, help="The identity's principal.")
@click.option("--json", "as_json", is_flag=True, help="Print the conversation as JSON.")
def conversation_show(
    conversation_id: str, tenant: str | None, principal: str | None, as_json: bool
) -> None:
    """Show a stored conversation and its unfinished turns."""
    from tasks.operate.inspect import conversation_view, summary_of

    identity = {k: v for k, v in (("tenant", tenant), ("principal", principal)) if v}
    view = conversation_view(_context(), conversation_id, identity or None)
    if not view.known:
        who = f" of {', '.join(f'{k} {v!r}' for k, v in identity.items())}" if identity else ""
        hint = "" if identity else " (--tenant/--principal select another identity's)"
        raise Failure(f"no conversation {conversation_id!r}{who} is stored or queued{hint}")
    history = (view.checkpoint.history or []) if view.checkpoint else []
    unfinished = [_listed(summary_of(r)) for r in view.unfinished]
    data: dict[str, Any] = {
        "conversationId": view.conversation_id,
        "namespace": view.namespace,
        "stored": view.checkpoint is not None,
        "unreadable": view.unreadable or None,
        "turns": sum(1 for m in history if m.get("role") == "user"),
        "turnNumber": view.checkpoint.turn_number if view.checkpoint else None,
        "lastRunId": view.checkpoint.run_id if view.checkpoint else None,
        "historyLength": len(history),
        "lastMessages": [
            {"role": m.get("role"), "content": _message_line(m, 500)} for m in history[-5:]
        ],
        "unfinishedTurns": unfinished,
    }
    if as_json:
        _print_json(data)
        return
    click.echo(f"conversation {conversation_id} (namespace {view.namespace})")
    if view.unreadable:
        click.echo(f"stored: unreadable: {view.unreadable}")
    elif view.checkpoint is None:
        click.echo("stored: nothing yet (its first turn has not finished)")
    else:
        number = f" (turnNumber {data['turnNumber']})" if data["turnNumber"] else ""
        click.echo(
            f"stored: {_plural(data['turns'], 'turn', 'turns')}{number}, "
            f"{_plural(len(history), 'message', 'messages')}, last runId {data['lastRunId']}"
        )
        for message in history[-5:]:
            click.echo(f"  {message.get('role')}: {_message_line(message, 70)}")
    click.echo(f"unfinished turns: {len(unfinished)}")
    for record in unfinished:
        click.echo(f"  {record['turnId']}  {record['describe']}")


@main.command()
def pump() -> None:
    """Run the pump: due retries, turns of dead workers, stalled conversations."""
    from tasks.turn.pump import main as pump_main

    pump_main()


@main.command()
@click.option(
    "--port", type=click.IntRange(0, 65535), default=9808, show_default=True, help="TCP port."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface).",
)
def metrics(port: int, host: str) -> None:
    """Serve Prometheus metrics at /metrics, read from the state store at each scrape."""
    import logging

    from tasks.core.redact import RedactingFilter
    from tasks.operate.metrics import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    ctx = _context()
    try:
        serve(ctx, port=port, host=host)
    except OSError as exc:
        raise Failure(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); is another "
            "process using the port? --port picks another"
        ) from None


@main.command()
def demo() -> None:
    """Run the demo: a worker and the pump on Redis, four turns (a retry, a dead letter, an
    approval), the dead letters."""
    from tasks.demo import main as demo_main

    raise SystemExit(demo_main())


if __name__ == "__main__":
    main()
