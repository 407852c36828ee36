"""The `agentjobs` command: inspect and replay dead letters, read a turn's state, run the pump
and the demo.

    agentjobs dlq list [--reason R] [--json]
    agentjobs dlq show ID [--json]
    agentjobs dlq replay ID
    agentjobs dlq purge [--reason R] [--older-than DURATION] [--yes]
    agentjobs turn show TASK_ID [--json]
    agentjobs pump
    agentjobs demo
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration_s(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d', '1w' -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 2h or 7d")
    return float(match[1]) * _UNIT_S[match[2]]


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
    # Wide enough for ids and errors when the output is a pipe or a log, not a terminal.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _context() -> Any:
    from tasks.context import job_context

    return job_context()


@click.group()
def main() -> None:
    """agentjobs: durable agent turns on Celery."""


@main.group()
def dlq() -> None:
    """The dead-letter store."""


@dlq.command("list")
@click.option("--reason", default=None, help="Only entries with this reason code.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of entries.")
def dlq_list(reason: str | None, as_json: bool) -> None:
    """List dead-lettered turns, oldest first."""
    store = _context().dead_letters
    if as_json:
        _stream_json_array(store.iter_entries(reason=reason, bodies=True))
    else:
        print_dead_letters(store.list_entries(reason=reason))


def print_dead_letters(entries: list[dict[str, Any]]) -> None:
    if not entries:
        click.echo("The dead-letter store is empty.")
        return
    table = Table("id", "reason", "error", "attempts", "agent", "conversation", "last failed")
    for entry in entries:
        table.add_row(
            entry["id"],
            entry["reason"],
            f"{entry['errorType']}: {entry['error']}"[:70],
            str(entry["attempts"]),
            entry["agent"],
            entry["conversationId"],
            entry["lastFailedAt"],
        )
    _console().print(table)
    click.echo(f"{len(entries)} entries. `agentjobs dlq show ID` for one, `replay ID` to retry.")


@dlq.command("show")
@click.argument("entry_id")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as one JSON object.")
def dlq_show(entry_id: str, as_json: bool) -> None:
    """Show one dead-letter entry, its checkpoint included."""
    entry = _context().dead_letters.get(entry_id)
    if entry is None:
        raise click.ClickException(f"no dead-letter entry {entry_id!r}")
    if as_json:
        _print_json(entry)
        return
    table = Table("field", "value", show_header=False)
    for key, value in entry.items():
        if key in ("checkpoint", "kwargs"):
            continue
        table.add_row(key, str(value))
    checkpoint = entry.get("checkpoint") or {}
    history = checkpoint.get("history") or []
    table.add_row("checkpoint", f"{len(history)} messages, runId {checkpoint.get('runId', '-')}")
    table.add_row("kwargs", orjson.dumps(entry.get("kwargs")).decode()[:200])
    _console().print(table)


@dlq.command("replay")
@click.argument("entry_id")
def dlq_replay(entry_id: str) -> None:
    """Enqueue a dead-lettered turn again with a fresh retry budget."""
    from tasks.deadletter import ReplayError

    try:
        replayed = _context().dead_letters.replay(entry_id)
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    if not replayed.first:
        click.echo(f"{entry_id} was already replayed as turn {replayed.turn_id}; not run again.")
        return
    how = "resuming its checkpoint" if replayed.resumed_from_checkpoint else "from its message"
    click.echo(f"replayed {entry_id} as turn {replayed.turn_id} ({how}).")
    click.echo(f"follow it with `agentjobs turn show {replayed.turn_id}`")


@dlq.command("purge")
@click.option("--reason", default=None, help="Only entries with this reason code.")
@click.option("--older-than", "older_than", default=None, help="Only entries older than this.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(reason: str | None, older_than: str | None, yes: bool) -> None:
    """Delete dead-letter entries (all, or those matching the options)."""
    older_than_s = parse_duration_s(older_than) if older_than else None
    if not yes and sys.stdin.isatty():
        click.confirm("Delete the matching dead-letter entries?", abort=True)
    removed = _context().dead_letters.purge(reason=reason, older_than_s=older_than_s)
    click.echo(f"purged {removed} entries.")


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
    if state == "dead_lettered":
        return f"dead-lettered as {record.get('deadLetterId')} ({record.get('reason')})"
    return str(state)


@turn.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
def turn_show(task_id: str, as_json: bool) -> None:
    """Show a turn's state: queued, running at iteration N, waiting for a retry, done."""
    record = _context().records.get(task_id)
    if record is None:
        raise click.ClickException(f"no turn {task_id!r} (finished turns are kept for 7 days)")
    data = record.as_dict()
    data["describe"] = describe_state(data)
    if as_json:
        _print_json(data)
        return
    table = Table("field", "value", show_header=False)
    table.add_row("state", data["describe"])
    for key in ("agent", "conversationId", "attempt", "deliveries", "worker", "lastError"):
        if data.get(key) not in (None, ""):
            table.add_row(key, str(data[key]))
    if data.get("result"):
        table.add_row("result", orjson.dumps(data["result"]).decode()[:200])
    _console().print(table)


@main.command()
def pump() -> None:
    """Run the pump: due retries, turns of dead workers, stalled conversations."""
    from tasks.pump import main as pump_main

    pump_main()


@main.command()
def demo() -> None:
    """Run the demo: a worker and the pump on Redis, three turns, the dead-letter listing."""
    from tasks.demo import main as demo_main

    raise SystemExit(demo_main())


if __name__ == "__main__":
    main()
