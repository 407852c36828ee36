"""`agentjobs metrics`: the job system's figures in the Prometheus text format, computed from the
state store at each scrape (docs/operations.md, "Telemetry"), so one exporter covers every
worker, and restarting a worker or the exporter loses no count.

Gauges come from the shard indices (tasks/operate/inspect.py, live_stats); counters from the shards'
counters hashes, which the Lua scripts increment in the same step as the change they count
(tasks/core/keys.py, ShardKeys.counters), and the messages workers dropped as unreadable from a key
of their own (Keys.bad_messages). Celery exporters read Redis queue lengths, which are wrong
for Celery's priority lists and say nothing of turns waiting out a retry in Redis; these do not
look at the broker at all.

A scrape that cannot read Redis answers `agentjobs_up 0` and nothing else, and the command logs
one line per outage rather than a traceback per scrape.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tasks.core.errors import Reason
from tasks.core.schema import CounterName
from tasks.operate.inspect import live_stats
from tasks.queue.context import JobContext

logger = logging.getLogger("agentjobs.metrics")
DEFAULT_PORT = 9808
# Loopback unless --host says otherwise: the server has no authentication or TLS.
DEFAULT_HOST = "127.0.0.1"
# A scrape is one short request: a connection that has not sent its request (or taken the
# answer) within this is closed, so idle and half-sent connections do not pile up threads.
REQUEST_TIMEOUT_S = 5.0
# How each turn ends (TurnState's terminal values): the outcome label of turns_finished_total.
OUTCOMES = ("succeeded", "dead_lettered", "cancelled")


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _labelled(
    family: GaugeMetricFamily | CounterMetricFamily, values: dict[str, int]
) -> GaugeMetricFamily | CounterMetricFamily:
    for label, value in sorted(values.items()):
        family.add_metric([label], value)
    return family


def tokens_family(counters: dict[str, int], tenant_labels: bool) -> CounterMetricFamily:
    """agentjobs_tokens_total from the counters "tokens US direction US model US tenant"
    (schema.CounterName.TOKENS): summed over tenants unless `tenant_labels`."""
    labels = ["direction", "model", "tenant"] if tenant_labels else ["direction", "model"]
    family = CounterMetricFamily(
        "agentjobs_tokens_total",
        "Tokens the providers reported, by direction (input, output) and model.",
        labels=labels,
    )
    sums: Counter[tuple[str, ...]] = Counter()
    for name, n in counters.items():
        if not name.startswith(CounterName.TOKENS):
            continue
        parts = name.removeprefix(CounterName.TOKENS).split("\x1f")
        if len(parts) != 3:
            continue
        sums[tuple(parts) if tenant_labels else tuple(parts[:2])] += n
    for key, n in sorted(sums.items()):
        family.add_metric(list(key), n)
    return family


def families(figures: dict[str, Any], tenant_labels: bool = False) -> Iterator[Metric]:
    """The metric families of one reading of live_stats; `tenant_labels`
    (AGENTJOBS_METRICS_TENANT_LABELS) adds a tenant label to agentjobs_tokens_total."""
    counters: dict[str, int] = figures["counters"]

    def counted(name: str) -> int:
        return counters.get(name, 0)

    yield _labelled(
        GaugeMetricFamily("agentjobs_turns", "Unfinished turns by state.", labels=["state"]),
        figures["turns"],
    )
    by_reason = {str(r): 0 for r in Reason} | figures["deadLetters"]["byReason"]
    yield _labelled(
        GaugeMetricFamily(
            "agentjobs_dead_letters",
            "Dead-letter entries stored (not yet replayed or purged), by reason.",
            labels=["reason"],
        ),
        by_reason,
    )
    yield _gauge(
        "agentjobs_oldest_runnable_age_seconds",
        "How long the turn that has waited longest for a worker has been runnable: a queued "
        "turn at the head of its conversation, or a retry past its due time; 0 when none.",
        figures["oldestRunnableAgeS"] or 0.0,
    )
    yield _gauge(
        "agentjobs_retries_due",
        "Waiting turns whose retry is due and not yet taken by a worker.",
        figures["retriesDueNow"],
    )
    yield _gauge(
        "agentjobs_retries_overdue",
        "Retries due more than five pump intervals ago and not yet taken: is the pump running?",
        figures["retriesOverdue"],
    )
    beat = figures["pump"]["lastHeartbeatAgeS"]
    yield _gauge(
        "agentjobs_pump_last_tick_age_seconds",
        "Seconds since a pump last completed a tick (+Inf when none has).",
        beat if beat is not None else math.inf,
    )
    yield _labelled(
        GaugeMetricFamily(
            "agentjobs_workers",
            "Workers by heartbeat: alive (within a lease lifetime) or silent (not yet removed "
            "by the pump).",
            labels=["state"],
        ),
        figures["workers"],
    )
    yield _counter("agentjobs_turns_submitted_total", "Turns registered.", counted("submitted"))
    yield _labelled(
        CounterMetricFamily(
            "agentjobs_turns_finished_total", "Turns that ended, by outcome.", labels=["outcome"]
        ),
        {outcome: counted(f"finished:{outcome}") for outcome in OUTCOMES},
    )
    dead_lettered = {str(r): 0 for r in Reason} | {
        name.removeprefix("dead_lettered:"): n
        for name, n in counters.items()
        if name.startswith("dead_lettered:")
    }
    yield _labelled(
        CounterMetricFamily(
            "agentjobs_turns_dead_lettered_total",
            "Turns dead-lettered, by reason (replays and purges do not lower it).",
            labels=["reason"],
        ),
        dead_lettered,
    )
    yield tokens_family(counters, tenant_labels)
    yield _labelled(
        CounterMetricFamily(
            "agentjobs_budget_waits_total",
            "Model calls that waited for a budget (provider:model) or a tenant's token cap "
            "(tenant_tokens) instead of starting.",
            labels=["budget"],
        ),
        {
            name.removeprefix(CounterName.BUDGET_WAITS): n
            for name, n in counters.items()
            if name.startswith(CounterName.BUDGET_WAITS)
        },
    )
    yield _counter(
        "agentjobs_retries_scheduled_total",
        "Failed attempts given a retry (a resumable failure with attempts left).",
        counted("retries_scheduled"),
    )
    yield _counter(
        "agentjobs_lease_takeovers_total",
        "Running turns claimed again after their lease ran out (their worker died or stalled).",
        counted("lease_takeovers"),
    )
    yield _counter(
        "agentjobs_handovers_total",
        "Running turns a worker that was shutting down handed to another (deploys).",
        counted("handovers"),
    )
    yield _counter(
        "agentjobs_pauses_total",
        "Times a running turn paused for a person's decision (approvals, questions).",
        counted("pauses"),
    )
    yield _counter(
        "agentjobs_bad_messages_total",
        "Broker messages for run_turn or resume_turn that workers dropped because their body "
        "could not be read as the task's arguments (not JSON, not Celery's shape, no task id).",
        figures.get("badMessages", 0),
    )


def bad_messages(ctx: JobContext) -> int:
    """Messages workers dropped as unreadable (tasks/turn/worker.py, MessageGuardStep): a key of
    its own, since no turn, and so no shard, is theirs."""
    return int(ctx.redis.get(ctx.keys.bad_messages) or 0)


class StoreCollector(Collector):
    """Reads the state store at each scrape."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._down = False

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        try:
            figures = {**live_stats(self._ctx), "badMessages": bad_messages(self._ctx)}
            found = list(families(figures, self._ctx.settings.metrics_tenant_labels))
        except redis.RedisError as exc:
            if not self._down:  # one line per outage
                logger.warning("metrics: cannot read Redis (%s); serving agentjobs_up 0", exc)
                self._down = True
            yield _gauge("agentjobs_up", "1 when this scrape read the state store.", 0)
            return
        if self._down:
            logger.info("metrics: Redis answers again")
            self._down = False
        yield _gauge("agentjobs_up", "1 when this scrape read the state store.", 1)
        yield from found
        yield _gauge(
            "agentjobs_scrape_duration_seconds",
            "How long reading the state store took for this scrape.",
            time.monotonic() - started,
        )


def registry_for(ctx: JobContext) -> CollectorRegistry:
    """A registry of the store's figures alone (no process or platform metrics: the command
    speaks for the job system, not for itself)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(ctx))
    return registry


class _Handler(WSGIRequestHandler):
    """One scrape per connection, logging nothing; its socket times out after
    REQUEST_TIMEOUT_S (prometheus_client's server waits on a silent client forever)."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, none outliving the process."""

    daemon_threads = True
    request_queue_size = 128  # a burst of connections waits in the backlog, not in SYN retries

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or went away: nothing to report (the base prints a traceback).
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def start_server(
    registry: CollectorRegistry, *, port: int, host: str
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` at host:port from a daemon thread. Raises OSError when the port cannot
    be bound."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class = type("MetricsServer", (_Server,), {"address_family": family})
    server: WSGIServer = make_server(
        str(address[0]), port, make_wsgi_app(registry), server_class, handler_class=_Handler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread


def serve(
    ctx: JobContext,
    *,
    port: int,
    host: str = DEFAULT_HOST,
    stop: threading.Event | None = None,
) -> None:
    """Serve /metrics until SIGTERM or SIGINT (or `stop`). Raises OSError when the port
    cannot be bound."""
    stop = stop or threading.Event()
    server, thread = start_server(registry_for(ctx), port=port, host=host)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    # No scheme: log lines have every URL redacted (core/redact.py), and this one is not secret.
    logger.info("serving metrics on %s:%d, path /metrics", host, port)
    try:
        stop.wait()
    finally:
        server.shutdown()
        thread.join(timeout=5)
        logger.info("metrics stopped")
