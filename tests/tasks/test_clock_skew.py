"""Clock skew (docs/operations.md, "Scale out"): leases, due times and
deadlines come from the Redis server's clock, so a pump and workers whose clocks disagree by
seconds still agree on when a retry is due and when a lease has run out.

The pump and a worker run under libfaketime, 3 s ahead of the real clock or 3 s behind it, each
the other way from the other (6 s apart). Every time checked is the server's, read from the
turn records; a wake-up that went by a skewed clock would come SKEW_S early (and be refused)
or SKEW_S late.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tasks import run_turn
from tasks.queue.context import job_context
from tasks.store.records import TurnRecord, TurnState
from tasks.testing import wait_until
from tests.tasks.faketime import IN_CI, faketime_prefix

pytestmark = pytest.mark.integration

SKEW_S = 3.0
# A due turn is woken on the pump's next tick (0.1 s) and claimed once a worker reads the
# message; on a loaded machine that takes well under this, which is under the skew.
LATE_SLACK_S = 2.0

Skewed = Callable[[float], list[str]]


@pytest.fixture(scope="module")
def skewed() -> Skewed:
    """skewed(offset_s) -> the command prefix that runs a process offset_s off the real clock."""
    if faketime_prefix(0) is None:
        message = "libfaketime is not installed (apt-get install faketime; .ci/run does)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)

    def prefix(offset_s: float) -> list[str]:
        found = faketime_prefix(offset_s)
        assert found is not None
        return found

    # The prefix really moves the clock of what it runs (and leaves time.sleep working), or these
    # tests would prove nothing.
    for offset_s in (SKEW_S, -SKEW_S):
        before = time.time()
        shown = subprocess.check_output(
            [
                *prefix(offset_s),
                sys.executable,
                "-c",
                "import time; time.sleep(0.01); print(time.time())",
            ]
        )
        after = time.time()
        assert before + offset_s <= float(shown) <= after + offset_s, (offset_s, shown)
    return prefix


def record_of(turn_id: str) -> TurnRecord:
    record = job_context().records.get(turn_id)
    assert record is not None, f"no turn record for {turn_id}"
    return record


def offset_id(offset_s: float) -> str:
    return "ahead" if offset_s > 0 else "behind"


@pytest.mark.parametrize("pump_offset_s", [SKEW_S, -SKEW_S], ids=["pump-ahead", "pump-behind"])
def test_a_retry_runs_when_due_by_the_server_clock(
    make_jobs: Any, skewed: Skewed, pump_offset_s: float
) -> None:
    # Given a pump whose clock is 3 s off and a worker 3 s off the other way, and a turn whose
    # first model call fails with 503: attempt 1's backoff is 2-4 s (base 4 s, equal jitter)
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="4")
    worker = jobs.worker(name="w1", command_prefix=skewed(-pump_offset_s))
    pump = jobs.pump(command_prefix=skewed(pump_offset_s))
    records = job_context().records
    submitted_ms = records.server_time_ms()

    # When the turn fails once and waits out its backoff
    result = run_turn.delay(agent="demo", conversation_id="skew-retry", message="hi fail:503x1")
    wait_until(
        lambda: record_of(result.id).state is TurnState.WAITING,
        15,
        "the turn to wait out its backoff",
    )
    seen_waiting_ms = records.server_time_ms()
    waiting = record_of(result.id)

    # Then the failure and due times are the server's: the failure happened between submitting
    # and seeing it, and the backoff is 2-4 s after it
    assert submitted_ms <= waiting.first_failed_at_ms <= seen_waiting_ms
    assert 2000 <= waiting.due_at_ms - waiting.first_failed_at_ms <= 4000

    # and attempt 2 starts when it is due, not before, not much later
    reply = result.get(timeout=30)
    assert reply["attempts"] == 2
    record = record_of(result.id)
    late_s = (record.started_at_ms - record.due_at_ms) / 1000
    print(f"\npump {offset_id(pump_offset_s)}: attempt 2 started {late_s:.3f} s after it was due")
    assert record.started_at_ms >= record.due_at_ms
    assert late_s <= LATE_SLACK_S
    # and no wake-up came early: a worker refuses one with not_due
    assert "not run by this delivery: not_due" not in worker.log()
    assert "woke 1 due retries" in pump.log()


@pytest.mark.parametrize(
    "worker_offset_s",
    [-SKEW_S, SKEW_S],
    ids=["worker-behind-pump-ahead", "worker-ahead-pump-behind"],
)
def test_a_running_turns_lease_is_taken_over_when_it_runs_out_by_the_server_clock(
    make_jobs: Any, skewed: Skewed, worker_offset_s: float
) -> None:
    # Given worker A, 3 s off, running a turn of four 1.5 s tool rounds (longer than its 3 s
    # lease, renewed every 0.75 s), the pump 3 s off the other way, and worker B on the real
    # clock standing by
    jobs = make_jobs()
    lease_ttl_s = job_context().settings.lease_ttl_s
    assert lease_ttl_s == 3.0
    records = job_context().records
    a = jobs.worker(name="wa", command_prefix=skewed(worker_offset_s))
    pump = jobs.pump(command_prefix=skewed(-worker_offset_s))
    result = run_turn.delay(
        agent="demo", conversation_id="skew-lease", message="where is it? rounds:4 slow:1.5"
    )
    turn_id = result.id
    wait_until(lambda: record_of(turn_id).state is TurnState.RUNNING, 15, "the turn to start")
    b = jobs.worker(name="wb")

    # When the turn has run past its lease lifetime, into round 3
    wait_until(lambda: record_of(turn_id).iteration >= 3, 20, "round 3 to start")
    running = record_of(turn_id)

    # Then nobody took it over meanwhile: one delivery, A's, under a lease that still stands
    assert records.server_time_ms() - running.started_at_ms > lease_ttl_s * 1000
    assert running.state is TurnState.RUNNING
    assert (running.deliveries, running.redeliveries) == (1, 0)
    assert running.worker.startswith("wa@")
    assert records.lease_holder(running.namespace) == turn_id
    assert "lost its worker" not in pump.log()

    # When A is SIGKILLed: its lease runs out lease_ttl_s after its last renewal, by the
    # server's clock, which is also when the running index expects it to
    a.kill()
    k = job_context().keys.for_namespace(running.namespace)
    remaining_ms = job_context().redis.pttl(k.lease(running.namespace))
    expires_at_ms = records.server_time_ms() + remaining_ms
    assert 0 < remaining_ms <= lease_ttl_s * 1000
    expected_ms = job_context().redis.zscore(k.running, turn_id)
    assert expected_ms is not None and abs(expected_ms - expires_at_ms) <= 100

    # Then B takes the turn over once the lease has run out, not before, not much later
    reply = result.get(timeout=30)
    assert reply["content"].startswith("Done: where is it?")
    record = record_of(turn_id)
    assert record.worker.startswith("wb@")
    assert (record.deliveries, record.redeliveries) == (2, 1)
    late_s = (record.started_at_ms - expires_at_ms) / 1000
    print(
        f"\nworker {offset_id(worker_offset_s)}, pump {offset_id(-worker_offset_s)}: "
        f"taken over {late_s:.3f} s after the lease ran out"
    )
    assert record.started_at_ms >= expires_at_ms
    assert late_s <= LATE_SLACK_S
    assert b.alive()
    # B's claim was the one wake-up: none came while A's lease stood (it would be refused busy)
    assert "not run by this delivery: busy" not in b.log()
