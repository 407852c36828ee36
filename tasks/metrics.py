"""`agentjobs metrics`: the job system's figures in the Prometheus text format, computed from the
state store at each scrape (docs/operations.md, "Telemetry"), so one exporter covers every
worker, and restarting a worker or the exporter loses no count.

Gauges come from the shard indices (tasks/inspect.py, live_stats); counters from the shards'
counters hashes, which the Lua scripts increment in the same step as the change they count
(tasks/keys.py, ShardKeys.counters). Celery exporters read Redis queue lengths, which are wrong
for Celery's priority lists and say nothing of turns waiting out a retry in Redis; these do not
look at the broker at all.

A scrape that cannot read Redis answers `agentjobs_up 0` and nothing else, and the command logs
one line per outage rather than a traceback per scrape.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tasks.context import JobContext
from tasks.errors import Reason
from tasks.inspect import live_stats

logger = logging.getLogger("agentjobs.metrics")
DEFAULT_PORT = 9808
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


def families(figures: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of one reading of live_stats."""
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


class StoreCollector(Collector):
    """Reads the state store at each scrape."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._down = False

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        try:
            found = list(families(live_stats(self._ctx)))
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


def serve(ctx: JobContext, *, port: int, host: str, stop: threading.Event | None = None) -> None:
    """Serve /metrics until SIGTERM or SIGINT (or `stop`). Raises OSError when the port
    cannot be bound."""
    stop = stop or threading.Event()
    server, thread = start_http_server(port, addr=host, registry=registry_for(ctx))
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    # No scheme: log lines have every URL redacted (tasks/redact.py), and this one is not secret.
    logger.info("serving metrics on %s:%d, path /metrics", host, port)
    try:
        stop.wait()
    finally:
        server.shutdown()
        thread.join(timeout=5)
        logger.info("metrics stopped")
