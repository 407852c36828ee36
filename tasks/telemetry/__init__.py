"""Telemetry of turns: OpenTelemetry spans of each attempt, its model calls and its tool
calls, joined to the submitter's trace (tracing). Optional: without the `otel` extra every
call here is a no-op. Metrics are served by tasks.operate.metrics from the store's counts.

May import: tasks.core, tasks.store, tasks.queue, agent.
"""
