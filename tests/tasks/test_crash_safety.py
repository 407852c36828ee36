"""Crash safety (docs/jobs.md, guarantee 3): SIGKILL of a worker process mid-turn loses at
most the
iteration in flight, and the turn resumes from its last persisted iteration within a bounded
delay (the lease TTL, then the pump's next tick), not Redis's visibility timeout.

Every test runs `rounds:3 slow:1.5` (three tool rounds of 1.5 s each) and kills while round 2's
tool runs: round 1 is persisted, round 2 is the iteration in flight.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tasks import load_conversation, run_turn
from tasks.queue.context import job_context
from tasks.store.records import TurnRecord
from tasks.testing import children_of, wait_until

pytestmark = pytest.mark.integration

ROUNDS = 3
SLOW_S = 1.5
MESSAGE = f"where is my order? rounds:{ROUNDS} slow:{SLOW_S}"
# Scheduling noise on a loaded machine: message delivery, a pool child restart, result polling.
SLACK_S = 3.0


def record_of(turn_id: str) -> TurnRecord:
    record = job_context().records.get(turn_id)
    assert record is not None, f"no turn record for {turn_id}"
    return record


def tool_runs(jobs: Any) -> dict[int, int]:
    """Executions of the demo tool per round, for the one turn of the test."""
    keys = list(jobs.redis.scan_iter(f"{job_context().keys.prefix}:demo:tool:*"))
    assert len(keys) <= 1, f"expected one turn's tool counter, found {keys}"
    if not keys:
        return {}
    return {int(k): int(v) for k, v in jobs.redis.hgetall(keys[0]).items()}


def gone(pid: int) -> bool:
    """True once the process is dead (reaped, or a zombie waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")


def start_and_reach_round_2(jobs: Any, conversation_id: str) -> tuple[Any, str]:
    """Submit the turn and return once round 1 is persisted and round 2's tool is running."""
    result = run_turn.delay(agent="demo", conversation_id=conversation_id, message=MESSAGE)
    turn_id = result.id

    def in_round_2() -> bool:
        record = job_context().records.get(turn_id)
        return record is not None and record.iteration == 2 and tool_runs(jobs).get(2) == 1

    wait_until(in_round_2, 20, "round 1 persisted and round 2's tool running")
    return result, turn_id


def kill_and_check_in_flight(jobs: Any, turn_id: str, kill: Callable[[], None]) -> float:
    """Kill, then check the kill really landed in round 2. Returns the kill time (epoch s)."""
    killed_at = time.time()
    kill()
    record = record_of(turn_id)
    assert record.iteration == 2, "the kill did not land while round 2 ran"
    assert record.state == "running"
    assert tool_runs(jobs) == {1: 1, 2: 1}
    return killed_at


def check_recovered(
    jobs: Any, result: Any, turn_id: str, conversation_id: str, killed_at: float, ready_at: float
) -> None:
    """The turn completed once, from round 1's checkpoint, within the bound."""
    reply = result.get(timeout=30)
    assert reply["content"] == f"Done: {MESSAGE[:60]}"
    assert reply["turnNumber"] == 1
    assert reply["attempts"] == 1, "a crash is a redelivery, not a failed attempt"

    stored = load_conversation(conversation_id)
    assert stored is not None
    roles = [m["role"] for m in stored.history]
    assert roles == ["user"] + ["assistant", "tool"] * ROUNDS + ["assistant"]
    tool_call_ids = [m["toolCallId"] for m in stored.history if m["role"] == "tool"]
    assert tool_call_ids == [f"call_{n}" for n in range(1, ROUNDS + 1)]
    asked = [c["id"] for m in stored.history for c in m.get("toolCalls", [])]
    assert asked == [f"call_{n}" for n in range(1, ROUNDS + 1)]

    # Round 1 was persisted: it did not run again. Round 2 was in flight: it ran again.
    assert tool_runs(jobs) == {1: 1, 2: 2, 3: 1}

    record = record_of(turn_id)
    assert record.state == "succeeded"
    assert record.attempt == 1
    assert record.deliveries == 2, "one crashed delivery, one that finished"
    # The turn's iterations, across the resume: ROUNDS tool rounds, then the answer.
    assert record.iteration == ROUNDS + 1

    settings = job_context().settings
    # The lease was renewed at most lease_ttl_s before the kill; the pump sees it expire on its
    # next tick; a replacement worker may still be starting; then rounds 2 and 3 run again.
    resume_bound_s = (
        max(settings.lease_ttl_s, ready_at - killed_at) + settings.pump_interval_s + SLACK_S
    )
    completion_bound_s = resume_bound_s + (ROUNDS - 1) * SLOW_S
    resumed_after_s = record.started_at_ms / 1000 - killed_at
    completed_after_s = record.finished_at_ms / 1000 - killed_at
    print(
        f"\nrecovery: resumed {resumed_after_s:.2f} s after the kill (bound {resume_bound_s:.2f}), "
        f"completed {completed_after_s:.2f} s after (bound {completion_bound_s:.2f})"
    )
    assert resumed_after_s > 0, "the turn did not restart after the kill"
    assert resumed_after_s < resume_bound_s
    assert completed_after_s < completion_bound_s


def test_sigkill_of_a_pool_child_mid_turn_resumes_from_the_last_round(make_jobs: Any) -> None:
    # Given a prefork worker with one pool child, running round 2 of a three-round turn
    jobs = make_jobs()
    worker = jobs.worker(pool="prefork", concurrency=1)
    jobs.pump()
    result, turn_id = start_and_reach_round_2(jobs, "crash-child")
    (child,) = children_of(worker.pid)

    # When the pool child is SIGKILLed (the OOM killer)
    def kill_child() -> None:
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: gone(child), 5, f"pool child {child} to die")

    killed_at = kill_and_check_in_flight(jobs, turn_id, kill_child)

    # Then the same worker finishes the turn from round 1's checkpoint, in time
    check_recovered(jobs, result, turn_id, "crash-child", killed_at, killed_at)
    assert worker.alive()
    assert child not in children_of(worker.pid), "the turn finished in a new pool child"


def test_sigkill_of_a_worker_main_process_resumes_on_a_replacement(make_jobs: Any) -> None:
    # Given a threads worker running round 2 of a three-round turn
    jobs = make_jobs()
    worker = jobs.worker(pool="threads", name="w1")
    jobs.pump()
    result, turn_id = start_and_reach_round_2(jobs, "crash-main")

    # When its main process is SIGKILLed and a supervisor starts a replacement
    killed_at = kill_and_check_in_flight(jobs, turn_id, worker.kill)
    assert not worker.alive()
    jobs.worker(pool="threads", name="w2")
    ready_at = time.time()

    # Then the replacement finishes the turn from round 1's checkpoint, in time (the message
    # the dead worker held stays unacked in Redis for the visibility timeout: the pump's
    # wake-up is what resumes it)
    check_recovered(jobs, result, turn_id, "crash-main", killed_at, ready_at)
    assert record_of(turn_id).worker.startswith("w2@")


def test_the_surviving_worker_takes_over_a_turn_of_a_killed_one(make_jobs: Any) -> None:
    # Given two threads workers, one of them running round 2 of a three-round turn
    jobs = make_jobs()
    workers = {name: jobs.worker(pool="threads", name=name) for name in ("w1", "w2")}
    jobs.pump()
    result, turn_id = start_and_reach_round_2(jobs, "crash-two")
    running_on = record_of(turn_id).worker.split("@", 1)[0]
    victim = workers.pop(running_on)
    (survivor_name, survivor) = next(iter(workers.items()))

    # When that worker is SIGKILLed and nothing replaces it
    killed_at = kill_and_check_in_flight(jobs, turn_id, victim.kill)

    # Then the other worker finishes the turn from round 1's checkpoint, in time
    check_recovered(jobs, result, turn_id, "crash-two", killed_at, killed_at)
    assert record_of(turn_id).worker.startswith(f"{survivor_name}@")
    assert survivor.alive()
    assert len([p for p in jobs.processes if p.name != "pump"]) == 2, "no replacement started"
