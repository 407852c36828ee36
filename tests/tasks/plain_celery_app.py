"""A plain Celery app, Celery's default configuration, on the Redis at REDIS_URL: the neighbour
tests/tasks/test_broadcasts.py runs beside our workers. PLAIN_CONTROL_EXCHANGE, when set, puts
its remote control on that exchange (ours, to hear our workers' replies)."""

from __future__ import annotations

import os

from celery import Celery


def make_app(broker_url: str | None, control_exchange: str | None = None) -> Celery:
    plain = Celery("plain", broker=broker_url, set_as_current=False)
    if control_exchange:
        plain.conf.control_exchange = control_exchange
    return plain


app = make_app(os.environ.get("REDIS_URL"), os.environ.get("PLAIN_CONTROL_EXCHANGE"))


@app.task(name="plain.add")  # type: ignore[untyped-decorator]
def add(a: int, b: int) -> int:
    return a + b
