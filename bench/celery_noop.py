"""A bare Celery task for bench/throughput.py's baseline, included into the same worker."""

from __future__ import annotations

from tasks.app import app


@app.task(name="bench.noop", acks_late=True)  # type: ignore[untyped-decorator]
def noop() -> dict[str, int]:
    return {"ok": 1}
