"""`agentjobs usage`: the tokens providers reported, per tenant, agent and model, over a span
(tasks/budgets/usage.py)."""

from __future__ import annotations

import click

from tasks.budgets.usage import BUCKET_MS, read_usage
from tasks.cli.options import Duration, not_empty
from tasks.cli.output import Column, format_table, human_s, print_json, terminal_width
from tasks.core.limits import MAX_WINDOW_MS
from tasks.queue.context import job_context

NO_TENANT = "-"


@click.command("usage")
@click.option("--tenant", default=None, callback=not_empty, help="Only this tenant's usage.")
@click.option(
    "--since",
    "since_s",
    type=Duration(),
    default="24h",
    show_default=True,
    help="How far back, e.g. 15m, 2h, 7d (at most 7d).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
def usage(tenant: str | None, since_s: float, as_json: bool) -> None:
    """Tokens in and out per tenant, agent and model, counted in five-minute spans."""
    since_ms = int(since_s * 1000)
    if since_ms > MAX_WINDOW_MS:
        raise click.BadParameter(
            "usage is kept for 7 days: ask for 7d or less", param_hint="--since"
        )
    ctx = job_context()
    rows = read_usage(ctx.redis, ctx.keys, since_ms, tenant)
    if as_json:
        print_json(
            {
                "sinceS": since_s,
                "bucketS": BUCKET_MS // 1000,
                "rows": [
                    {
                        "tenant": row.tenant,
                        "agent": row.agent,
                        "model": row.model,
                        "inputTokens": row.input_tokens,
                        "outputTokens": row.output_tokens,
                    }
                    for row in rows
                ],
            }
        )
        return
    span = human_s(since_s)
    if not rows:
        whose = f" for tenant {tenant!r}" if tenant is not None else ""
        click.echo(f"no tokens reported in the last {span}{whose}")
        return
    columns = [
        Column("TENANT"),
        Column("AGENT"),
        Column("MODEL", flexible=True),
        Column("INPUT"),
        Column("OUTPUT"),
    ]
    cells = [
        [
            row.tenant or NO_TENANT,
            row.agent,
            row.model,
            f"{row.input_tokens:,}",
            f"{row.output_tokens:,}",
        ]
        for row in rows
    ]
    total_in = sum(row.input_tokens for row in rows)
    total_out = sum(row.output_tokens for row in rows)
    cells.append(["all", "", "", f"{total_in:,}", f"{total_out:,}"])
    click.echo(format_table(columns, cells, terminal_width()))
    click.echo(f"(the last {span}, in whole five-minute spans)")
