"""Recovery with the default lease: after a worker's main process is
SIGKILLed, its running turn starts again on another worker within the lease (10 s), a pump
tick and some slack; so does a queued turn whose message that worker held prefetched and
never started, woken because the worker's heartbeat stopped (turn/worker.py, turn/pump.py
wake_orphans). Each test prints the delay it measured, on the server's clock.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tasks import run_turn
from tasks.core.settings import Settings
from tasks.queue.context import job_context
from tasks.store.records import TurnRecord, TurnState
from tasks.testing import wait_until

pytestmark = pytest.mark.integration

# The default lease, set explicitly: tests/tasks/conftest.py's job_env shortens it for speed.
LEASE_TTL_S = Settings.lease_ttl_s
DEFAULT_TIMINGS = {
    "AGENTJOBS_LEASE_TTL_S": f"{LEASE_TTL_S:g}",
    "AGENTJOBS_PUMP_INTERVAL_S": f"{Settings.pump_interval_s:g}",
}
# A wake-up reaching a worker, the worker claiming the turn, on a loaded 2-core machine.
SLACK_S = 2.0
RECOVERY_BOUND_S = LEASE_TTL_S + Settings.pump_interval_s + SLACK_S


def record_of(turn_id: str) -> TurnRecord:
    record = job_context().records.get(turn_id)
    assert record is not None, f"no turn record for {turn_id}"
    return record


def heartbeat(worker_name: str) -> dict[str, Any] | None:
    """The worker's last heartbeat in Redis: {at (server epoch ms), received [[turn, ns]]}."""
    ctx = job_context()
    for name, raw in ctx.redis.hgetall(ctx.keys.workers).items():
        if name.decode().startswith(f"{worker_name}@"):
            beat: dict[str, Any] = orjson.loads(raw)
            return beat
    return None


def holds_prefetched(worker_name: str, turn_id: str) -> bool:
    beat = heartbeat(worker_name)
    return beat is not None and turn_id in [turn for turn, _ in beat["received"]]


def test_a_killed_workers_running_turn_restarts_on_another_within_the_lease(
    make_jobs: Any,
) -> None:
    # Given two threads workers on the default lease, one of them in round 2 of a turn of
    # three 2 s tool rounds
    jobs = make_jobs(**DEFAULT_TIMINGS)
    assert job_context().settings.lease_ttl_s == LEASE_TTL_S
    workers = {name: jobs.worker(name=name) for name in ("w1", "w2")}
    jobs.pump()
    records = job_context().records
    message = "where is my order? rounds:3 slow:2"
    result = run_turn.delay(agent="demo", conversation_id="recover-running", message=message)
    turn_id = result.id
    wait_until(lambda: record_of(turn_id).iteration == 2, 30, "round 2 to start")
    running = record_of(turn_id)
    victim_name = running.worker.split("@", 1)[0]
    victim = workers.pop(victim_name)
    ((survivor_name, survivor),) = workers.items()

    # When that worker's main process is SIGKILLed, just after round 1's checkpoint renewed
    # the lease: the worst case, a whole lease to wait out
    killed_at_ms = records.server_time_ms()
    victim.kill()
    lease_key = job_context().keys.for_namespace(running.namespace).lease(running.namespace)
    lease_expires_at_ms = records.server_time_ms() + job_context().redis.pttl(lease_key)

    # Then the other worker starts the turn again once the lease runs out, within the bound,
    # and finishes it from round 1's checkpoint
    reply = result.get(timeout=60)
    assert reply["content"] == f"Done: {message}"
    record = record_of(turn_id)
    assert record.state is TurnState.SUCCEEDED
    assert record.worker.startswith(f"{survivor_name}@")
    assert (record.deliveries, record.redeliveries) == (2, 1)
    restarted_after_s = (record.started_at_ms - killed_at_ms) / 1000
    print(
        f"\nrunning turn restarted {restarted_after_s:.2f} s after the SIGKILL (its lease ran out "
        f"at +{(lease_expires_at_ms - killed_at_ms) / 1000:.2f} s; bound {RECOVERY_BOUND_S:.1f} s)"
    )
    assert record.started_at_ms >= lease_expires_at_ms
    assert restarted_after_s <= RECOVERY_BOUND_S
    assert survivor.alive()


def test_a_turn_prefetched_by_a_killed_worker_is_woken_when_its_heartbeat_stops(
    make_jobs: Any,
) -> None:
    # Given a threads worker with one slot, busy with a slow turn and holding the next turn's
    # message prefetched, as its heartbeat says; the stall timeout is far away, so only the
    # heartbeat can wake that turn. (A prefetch multiplier of 2: with acks_late, Celery
    # reserves no more than concurrency x multiplier unacknowledged messages, the running one
    # included, so 1 x 1 would leave the next message in the queue for anyone.)
    jobs = make_jobs(**DEFAULT_TIMINGS, AGENTJOBS_STALL_AFTER_S="120")
    w1 = jobs.worker(name="w1", concurrency=1, extra_args=["--prefetch-multiplier", "2"])
    pump = jobs.pump()
    records = job_context().records
    busy = run_turn.delay(
        agent="demo", conversation_id="recover-busy", message="where is my order? rounds:2 slow:6"
    )
    wait_until(lambda: record_of(busy.id).state is TurnState.RUNNING, 30, "the slow turn to start")
    prefetched = run_turn.delay(agent="demo", conversation_id="recover-prefetched", message="hi")
    wait_until(lambda: holds_prefetched("w1", prefetched.id), 15, "w1 to report it prefetched")
    # A second worker now cannot get that message: w1 holds it
    w2 = jobs.worker(name="w2")
    assert record_of(prefetched.id).state is TurnState.QUEUED
    assert record_of(busy.id).worker.startswith("w1@")

    # When w1's main process is SIGKILLed
    killed_at_ms = records.server_time_ms()
    w1.kill()
    last_beat = heartbeat("w1")
    assert last_beat is not None and prefetched.id in [turn for turn, _ in last_beat["received"]]

    # Then the pump wakes the prefetched turn once w1's heartbeat is a lease old, and w2 runs it
    # within the bound
    reply = prefetched.get(timeout=60)
    assert reply["content"] == "Done: hi"
    record = record_of(prefetched.id)
    assert record.worker.startswith("w2@")
    assert record.deliveries == 1, "its first start: the prefetched message never ran"
    woken_after_s = (record.started_at_ms - killed_at_ms) / 1000
    print(
        f"\nprefetched turn started {woken_after_s:.2f} s after the SIGKILL (w1's last beat "
        f"{(killed_at_ms - last_beat['at']) / 1000:.2f} s before it; bound "
        f"{RECOVERY_BOUND_S:.1f} s)"
    )
    assert record.started_at_ms >= last_beat["at"] + LEASE_TTL_S * 1000
    assert woken_after_s <= RECOVERY_BOUND_S
    assert "stopped; waking 1 turns it held" in pump.log()
    assert heartbeat("w1") is None, "the pump removes a stopped worker's heartbeat"
    # and the slow turn it was running resumes on w2 as well
    assert busy.get(timeout=60)["content"].startswith("Done: where is my order?")
    assert record_of(busy.id).worker.startswith("w2@")
    assert w2.alive()
