"""Imported at start-up only by the processes tests run under libfaketime
(tests/tasks/harness.py, faketime_prefix): its directory is on their PYTHONPATH, nobody else's.

libfaketime 0.9.10 with the monotonic clock left true (FAKETIME_DONT_FAKE_MONOTONIC=1, without
which Python's timed waits never return) fails Python 3.11's time.sleep with EINVAL: it shifts
the absolute monotonic deadline of clock_nanosleep by the fake offset (wolfcw/libfaketime#426).
Sleep on a timed wait instead, which it leaves alone.
"""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
