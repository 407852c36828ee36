"""The backoff policy: one function, the only place a retry delay is computed
(docs/jobs.md, guarantee 4)."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay_s(
    attempt: int,
    *,
    base_s: float,
    cap_s: float,
    retry_after_s: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before the attempt after failed attempt number `attempt` (1 for the first).

    d = min(cap, base * 2**(attempt-1)), then equal jitter: d/2 + U(0, d/2), never below half.
    A provider's retry-after raises the delay to at least that, still capped.
    """
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 s is already past any cap
    delay = min(cap_s, base_s * 2.0**exponent)
    delay = delay / 2 + rand() * delay / 2
    if retry_after_s is not None and retry_after_s > delay:
        delay = retry_after_s
    return min(cap_s, delay)
