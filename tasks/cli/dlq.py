"""`agentjobs dlq`: the dead-letter store. List and show entries, replay them as new turns,
purge them by reason, age or all at once.

Times print as ISO 8601 UTC. An entry holds each of its times twice, as ms since the epoch
(firstFailedAtMs) and as ISO text (firstFailedAt): `--json` prints both, as stored, since
scripts may read either; the tables print the ISO ones only."""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from tasks.cli.errors import Failure
from tasks.cli.options import REASON, Duration
from tasks.cli.output import (
    Column,
    format_table,
    human_s,
    plural,
    print_fields,
    print_json,
    short_time,
    stream_json_array,
    terminal_width,
)
from tasks.queue.context import JobContext, job_context
from tasks.store.dead_letters import UNREADABLE, ReplayError, UnreadableEntry, iso_ms
from tasks.turn.ending import Replayed, replay_dead_letter


@click.group("dlq")
def dlq() -> None:
    """The dead-letter store."""


@dlq.command("list")
@click.option("--reason", type=REASON, default=None, help="Only entries with this reason.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of entries.")
def dlq_list(reason: str | None, as_json: bool) -> None:
    """List dead-lettered turns, oldest first."""
    store = job_context().dead_letters
    if as_json:
        stream_json_array(store.iter_entries(reason=reason, bodies=True))
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
        short_time(entry["lastFailedAt"]),
        f"{entry.get('errorType', '?')}: {entry.get('error', '')}",
    ]


def print_dead_letters(entries: list[dict[str, Any]]) -> None:
    """The entries as a table, with their count and what to do next."""
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
    click.echo(format_table(columns, [_entry_row(e) for e in entries], terminal_width()))
    unreadable = sum(1 for e in entries if UNREADABLE in e)
    broken = f", {unreadable} unreadable (replay skips them)" if unreadable else ""
    click.echo(f"{plural(len(entries), 'entry', 'entries')}{broken}.")
    click.echo("`agentjobs dlq show ID` shows one; `agentjobs dlq replay ID` runs it again.")


@dlq.command("show")
@click.argument("entry_id")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the entry as one JSON object, its times both in ms (firstFailedAtMs) and ISO.",
)
def dlq_show(entry_id: str, as_json: bool) -> None:
    """Show one dead-letter entry, its checkpoint included. Times print as ISO 8601 UTC; --json
    keeps the entry as stored, each time in ms since the epoch and as ISO text."""
    entry = job_context().dead_letters.get(entry_id)
    if entry is None:
        raise Failure(f"no dead-letter entry {entry_id!r}; `agentjobs dlq list` shows them")
    if UNREADABLE in entry:
        raise UnreadableEntry(entry_id, entry[UNREADABLE])
    if as_json:
        print_json(entry)
        return
    rows = entry_rows(entry)
    checkpoint = entry.get("checkpoint") or {}
    history = checkpoint.get("history") or []
    messages = plural(len(history), "message", "messages")
    rows.append(("checkpoint", f"{messages}, runId {checkpoint.get('runId', '-')}"))
    rows.append(("kwargs", orjson.dumps(entry.get("kwargs")).decode()[:200]))
    print_fields(rows)


def entry_rows(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """An entry's summary fields as `dlq show` prints them, times as ISO UTC only: a
    `<name>AtMs` field is left out when its ISO twin `<name>At` is there (the store gives
    both), and printed as ISO under the twin's name when it is not."""
    rows = []
    for key, value in entry.items():
        if key in ("checkpoint", "kwargs"):
            continue
        if key.endswith("AtMs"):
            twin = key.removesuffix("Ms")
            if twin in entry:
                continue
            ms = value if isinstance(value, int | float) and not isinstance(value, bool) else 0
            rows.append((twin, iso_ms(int(ms)) if ms > 0 else str(value)))
            continue
        rows.append((key, str(value)))
    return rows


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
    ctx = job_context()
    if entry_id is not None:
        replayed = replay_dead_letter(ctx, entry_id)
        _echo_replayed(entry_id, replayed)
        click.echo(f"follow it with `agentjobs turn show {replayed.turn_id}`")
    else:
        _replay_all(ctx, reason)


def _replay_all(ctx: JobContext, reason: str | None) -> None:
    """`dlq replay --all`: every entry (of `reason`), then one line on what was skipped."""
    entries = ctx.dead_letters.list_entries(reason=reason)
    if not entries:
        which = f" with reason {reason}" if reason else ""
        click.echo(f"no dead-letter entries{which}; nothing replayed.")
        return
    new_ids, skipped = _replay_each(ctx, entries)
    if len(entries) > 1:
        click.echo(f"{plural(len(new_ids), 'entry', 'entries')} replayed.")
    if new_ids:
        click.echo(
            f"follow it with `agentjobs turn show {new_ids[0]}`"
            if len(new_ids) == 1
            else "follow each with `agentjobs turn show NEW_ID`, or all with `agentjobs turn list`"
        )
    if skipped:
        raise Failure(
            f"skipped {plural(len(skipped), 'entry', 'entries')} it could not replay: "
            f"{', '.join(skipped)}; they stay in the store (`agentjobs dlq show ID` says why)"
        )


def _replay_each(ctx: JobContext, entries: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
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
            replayed = replay_dead_letter(ctx, one)
        except ReplayError as exc:
            why = exc.problem if isinstance(exc, UnreadableEntry) else str(exc).split(";")[0]
            click.echo(f"skipped {one}: {why}.")
            skipped.append(one)
            continue
        _echo_replayed(one, replayed)
        new_ids.append(replayed.turn_id)
    return new_ids, skipped


def _echo_replayed(entry_id: str, replayed: Replayed) -> None:
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
    _check_purge(reason, older_than_s, every, yes)
    store = job_context().dead_letters
    # The entries counted in the question are the ones deleted, whatever is filed meanwhile.
    doomed = store.purgeable(reason=reason, older_than_s=older_than_s)
    if doomed and not yes:
        count = plural(len(doomed), "dead-letter entry", "dead-letter entries")
        if not click.confirm(f"Delete {count}{_purge_filter(reason, older_than_s)}?"):
            raise Failure("not confirmed; nothing deleted")
    removed = store.remove(doomed)
    click.echo(f"purged {plural(removed, 'entry', 'entries')}.")


def _check_purge(reason: str | None, older_than_s: float | None, every: bool, yes: bool) -> None:
    """Refuse a purge that does not say what to delete, or that nobody could confirm."""
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


def _purge_filter(reason: str | None, older_than_s: float | None) -> str:
    which = [f"reason {reason}"] if reason else []
    if older_than_s is not None:
        which.append(f"failed more than {human_s(older_than_s)} ago")
    return f" ({', '.join(which)})" if which else " (all of them)"
