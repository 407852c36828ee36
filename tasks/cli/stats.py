"""`agentjobs stats`: the job system's figures (tasks/operate/inspect.py, stats), as lines for a
person or as one JSON object."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from tasks.cli.output import human_s, plural, print_json
from tasks.core.settings import Settings
from tasks.operate.inspect import OVERDUE_PUMP_INTERVALS
from tasks.operate.inspect import stats as read_stats
from tasks.queue.context import job_context


@click.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def stats(as_json: bool) -> None:
    """Turns by state, dead letters by reason, retries due, the oldest runnable turn's age and
    the pump's last heartbeat."""
    ctx = job_context()
    figures = read_stats(ctx)
    if as_json:
        print_json(figures)
        return
    _echo_turns(figures, ctx.settings)
    _echo_waits(figures)
    _echo_pump(figures["pump"])
    _echo_state(figures["state"])
    _echo_trouble(figures, ctx.settings)


def _echo_turns(figures: dict[str, Any], settings: Settings) -> None:
    """Turns by state, and dead letters by reason."""
    turns = figures["turns"]
    click.echo("turns          " + "  ".join(f"{state} {n}" for state, n in turns.items()))
    kept = human_s(settings.record_ttl_s)
    click.echo(f"               (finished: records kept {kept}, AGENTJOBS_RECORD_TTL_S)")
    dead = figures["deadLetters"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in dead["byReason"].items())
    click.echo(f"dead letters   {dead['total']}" + (f": {reasons}" if reasons else ""))


def _echo_waits(figures: dict[str, Any]) -> None:
    """The retries due, and how long the oldest turns have waited."""
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


def _echo_pump(pump: dict[str, Any]) -> None:
    beat = pump["lastHeartbeatAgeS"]
    click.echo(
        "pump           "
        + (
            f"last tick {human_s(beat)} ago"
            if beat is not None
            else "no heartbeat (no pump has run in AGENTJOBS_RECORD_TTL_S)"
        )
    )


def _at_s(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


def _echo_state(state: dict[str, Any]) -> None:
    """The state store's lines: its epoch, and plainly, any loss on record."""
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
            f"STATE LOST     {plural(state['stateLostTurns'], 'turn', 'turns')} dead-lettered "
            "as state_lost: `agentjobs dlq list --reason state_lost`"
        )


def _echo_trouble(figures: dict[str, Any], settings: Settings) -> None:
    """Only when there is some: unreadable records, and retries overdue with no pump."""
    unreadable = figures["unreadableRecords"]
    if unreadable["total"]:
        click.echo(
            f"unreadable     {plural(unreadable['total'], 'turn record', 'turn records')} "
            f"skipped by the pump and listings: {', '.join(unreadable['turnIds'])}"
        )
    if figures["retriesOverdue"] and figures["pump"]["mayBeDown"]:
        late_s = OVERDUE_PUMP_INTERVALS * settings.pump_interval_s
        click.echo(
            f"overdue        {plural(figures['retriesOverdue'], 'waiting turn', 'waiting turns')}"
            f" due more than {human_s(late_s)} ago: the pump may be down; start it with "
            "`agentjobs pump`"
        )
