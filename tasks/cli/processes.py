"""The commands that run as processes until stopped or done: `agentjobs pump`, `agentjobs
metrics` (the Prometheus exporter) and `agentjobs demo`."""

from __future__ import annotations

import click

from tasks import demo as demo_process
from tasks.cli.errors import Failure
from tasks.core.redact import log_redacted
from tasks.operate.metrics import serve
from tasks.queue.context import job_context
from tasks.turn import pump as pump_process


@click.command("pump")
def pump() -> None:
    """Run the pump: due retries, turns of dead workers, stalled conversations."""
    pump_process.main()


@click.command("metrics")
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
    log_redacted()
    ctx = job_context()
    try:
        serve(ctx, port=port, host=host)
    except OSError as exc:
        raise Failure(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); is another "
            "process using the port? --port picks another"
        ) from None


@click.command("demo")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port of the demo's metrics exporter (default 9808, or a free one when 9808 is taken).",
)
def demo(metrics_port: int | None) -> None:
    """Run the demo: a worker and the pump on Redis, four turns (a retry, a dead letter, an
    approval), the dead letters."""
    raise SystemExit(demo_process.main(metrics_port=metrics_port))
