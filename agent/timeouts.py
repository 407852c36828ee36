"""Tool timeouts (docs/operations.md, "Cancel and deadlines"): stop waiting for a call.

Python cannot stop a thread, so a call past its limit is left behind: it keeps running in its
daemon thread, and whatever it returns or raises later is dropped, never reaching history. Only
a call with a limit pays for a thread; the runtime calls a tool without one inline. One thread
per call rather than a pool: a pool's workers would fill up with hung calls and block the next
ones, and its threads are joined at exit, so a hung tool would keep the process from ending.
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable
from numbers import Real
from typing import Any


class CallTimedOut(Exception):
    """Raised to the runtime when a call is past its limit. Never leaves the runtime."""


def check_timeout_s(value: object, subject: str) -> float | None:
    """`value` as seconds (None: no limit), or TypeError / ValueError naming `subject`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{subject} must be a number of seconds or None, not {type(value).__name__}"
        )
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{subject} must be a positive, finite number of seconds, got {value!r}")
    return seconds


def timed_out_text(tool: str, timeout_s: float) -> str:
    """The tool message content of a call that was left behind."""
    return (
        f"[timed out] {tool} did not finish within {timeout_s:g} s; it may still complete in "
        "the background."
    )


class _Outcome:
    """What the call's thread hands over, unless the caller gave up on it first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._abandoned = False
        self.value: Any = None
        self.error: BaseException | None = None

    def settle(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._abandoned:
                return  # too late: the run has moved on and must not see it
            self.value, self.error = value, error
            self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """True when the call settled in time; otherwise it is abandoned, for good."""
        self._done.wait(timeout_s)
        with self._lock:
            if not self._done.is_set():
                self._abandoned = True
            return self._done.is_set()


def call_with_timeout(fn: Callable[[], Any], timeout_s: float, *, name: str) -> Any:
    """fn() in a daemon thread: its value, its exception re-raised, or CallTimedOut once it has
    run for `timeout_s`. The thread runs in a copy of the caller's context (contextvars)."""
    outcome = _Outcome()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            value = context.run(fn)
        except BaseException as exc:  # handed to the caller, or dropped with the call
            outcome.settle(None, exc)
        else:
            outcome.settle(value, None)

    threading.Thread(target=work, name=f"agent-tool:{name}", daemon=True).start()
    if not outcome.wait(timeout_s):
        raise CallTimedOut(timed_out_text(name, timeout_s))
    if outcome.error is not None:
        raise outcome.error
    return outcome.value
