"""Backoff (docs/jobs.md, guarantee 4): the delay policy, and a retry waiting out its backoff that
survives a worker SIGKILL and still runs on time."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks import run_turn
from tasks.core.backoff import backoff_delay_s
from tasks.queue.context import job_context
from tasks.store.records import TurnRecord
from tasks.testing import wait_until

# -- the policy (pure) ---------------------------------------------------------------------------

BASE_S = 2.0
CAP_S = 300.0


def highest(attempt: int, **options: Any) -> float:
    return backoff_delay_s(attempt, base_s=BASE_S, cap_s=CAP_S, rand=lambda: 1.0, **options)


def lowest(attempt: int, **options: Any) -> float:
    return backoff_delay_s(attempt, base_s=BASE_S, cap_s=CAP_S, rand=lambda: 0.0, **options)


def test_the_delay_doubles_per_attempt_up_to_the_cap() -> None:
    assert [highest(n) for n in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def test_a_huge_attempt_number_is_capped_without_overflow() -> None:
    assert highest(10_000) == CAP_S
    assert lowest(10_000) == CAP_S / 2


def test_equal_jitter_spans_half_the_delay_to_all_of_it() -> None:
    assert [lowest(n) for n in range(1, 6)] == [1, 2, 4, 8, 16]
    assert lowest(20) == CAP_S / 2
    middle = backoff_delay_s(3, base_s=BASE_S, cap_s=CAP_S, rand=lambda: 0.5)
    assert middle == 6.0


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base_s=st.floats(min_value=0.01, max_value=100),
    extra_s=st.floats(min_value=0, max_value=10_000),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_jitter_never_goes_below_half_nor_above_the_delay(
    attempt: int, base_s: float, extra_s: float, rand: float
) -> None:
    cap_s = base_s + extra_s
    delay = backoff_delay_s(attempt, base_s=base_s, cap_s=cap_s, rand=lambda: rand)
    full = min(cap_s, base_s * 2.0 ** (attempt - 1))
    assert full / 2 <= delay <= full


def test_retry_after_raises_the_delay() -> None:
    assert highest(1, retry_after_s=30) == 30
    assert lowest(4, retry_after_s=10) == 10  # jittered delay 8 s, the provider asked for 10


def test_retry_after_below_the_delay_changes_nothing() -> None:
    assert highest(5, retry_after_s=3) == 32
    assert lowest(5, retry_after_s=3) == 16


def test_retry_after_is_still_capped() -> None:
    assert highest(1, retry_after_s=3600) == CAP_S
    assert lowest(1, retry_after_s=3600) == CAP_S


@given(
    attempt=st.integers(min_value=1, max_value=200),
    retry_after_s=st.floats(min_value=0, max_value=10_000),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_retry_after_is_a_floor_under_the_cap(
    attempt: int, retry_after_s: float, rand: float
) -> None:
    delay = backoff_delay_s(
        attempt, base_s=BASE_S, cap_s=CAP_S, retry_after_s=retry_after_s, rand=lambda: rand
    )
    plain = backoff_delay_s(attempt, base_s=BASE_S, cap_s=CAP_S, rand=lambda: rand)
    assert delay == min(CAP_S, max(plain, retry_after_s))


# -- a waiting retry on real workers -------------------------------------------------------------

# Attempt 1's delay is min(cap 5 s, base 4 s) = 4 s, jittered to 2-4 s: time to kill a worker.
BACKOFF_BASE_S = 4.0
# A due retry is woken on the pump's next tick and claimed as soon as a worker reads it.
LATE_SLACK_S = 2.0


def record_of(turn_id: str) -> TurnRecord:
    record = job_context().records.get(turn_id)
    assert record is not None, f"no turn record for {turn_id}"
    return record


@pytest.mark.integration
def test_a_waiting_retry_survives_a_worker_sigkill_and_runs_on_time(make_jobs: Any) -> None:
    # Given a turn whose first model call fails with 503, waiting out a 2-4 s backoff
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S=str(BACKOFF_BASE_S))
    worker = jobs.worker(pool="threads", name="w1")
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="backoff-1", message="hi fail:503x1")
    turn_id = result.id

    def waiting() -> bool:
        record = job_context().records.get(turn_id)
        return record is not None and record.state == "waiting" and bool(record.due_at_ms)

    wait_until(waiting, 15, "the turn to wait out its backoff")
    waiting_record = record_of(turn_id)
    due_at_ms = waiting_record.due_at_ms
    failed_at_ms = waiting_record.first_failed_at_ms
    assert BACKOFF_BASE_S / 2 <= (due_at_ms - failed_at_ms) / 1000 <= BACKOFF_BASE_S + 0.1
    assert waiting_record.attempt == 2

    # When the worker is SIGKILLed during the wait and a supervisor starts another one
    worker.kill()
    assert time.time() * 1000 < due_at_ms, "the kill came after the retry was due"
    assert record_of(turn_id).state == "waiting"
    jobs.worker(pool="threads", name="w2")
    ready_at_ms = int(time.time() * 1000)

    # Then the new worker runs attempt 2 when it is due, not before, not much later
    reply = result.get(timeout=30)
    assert reply["content"] == "Done: hi fail:503x1"
    assert reply["attempts"] == 2
    record = record_of(turn_id)
    assert record.state == "succeeded"
    assert record.attempt == 2
    assert record.worker.startswith("w2@")
    started_at_ms = record.started_at_ms
    late_s = (started_at_ms - due_at_ms) / 1000
    print(
        f"\nattempt 2 started {late_s:.3f} s after it was due (worker ready at +"
        f"{(ready_at_ms - due_at_ms) / 1000:.3f} s)"
    )
    assert started_at_ms >= due_at_ms, "attempt 2 started before its backoff was over"
    assert started_at_ms <= max(due_at_ms, ready_at_ms) + LATE_SLACK_S * 1000
    # The model was called once per attempt: the failed call and the one that answered.
    calls_keys = list(jobs.redis.scan_iter(f"{job_context().keys.prefix}:demo:calls:*"))
    assert [int(jobs.redis.get(key)) for key in calls_keys] == [2]
