"""Poison turns (docs/jobs.md, guarantee 5): a turn that kills its worker every time it runs is
dead-lettered as `poison` after AGENTJOBS_MAX_DELIVERIES crashed deliveries, instead of being
redelivered forever, and the worker keeps serving other turns."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tasks import Reason, TurnDeadLettered, run_turn
from tasks.queue.context import job_context
from tasks.testing import children_of

pytestmark = pytest.mark.integration

MAX_DELIVERIES = 2
# The prefork pool reports each child the crasher's tool SIGKILLed.
CHILD_KILLED = re.compile(r"Process 'ForkPoolWorker-\d+' pid:\d+ exited with 'signal 9")


def test_a_turn_that_kills_its_worker_is_dead_lettered_as_poison(make_jobs: Any) -> None:
    # Given a prefork worker with one pool child and a turn whose tool SIGKILLs its process
    jobs = make_jobs(AGENTJOBS_MAX_DELIVERIES=str(MAX_DELIVERIES))
    worker = jobs.worker(pool="prefork", concurrency=1)
    jobs.pump()
    first_child = children_of(worker.pid)

    # When it is submitted
    result = run_turn.delay(agent="crasher", conversation_id="poison-1", message="crash please")

    # Then after MAX_DELIVERIES crashed deliveries it is dead-lettered as poison
    with pytest.raises(TurnDeadLettered) as raised:
        result.get(timeout=30)
    assert raised.value.reason == Reason.POISON
    entry_id = raised.value.entry_id

    record = job_context().records.get(result.id)
    assert record is not None
    assert record.state == "dead_lettered"
    assert record.reason == "poison"
    assert record.dlq_id == entry_id
    # Deliveries that ran and crashed, then the one that set the turn aside without running.
    assert record.deliveries == MAX_DELIVERIES + 1
    assert len(CHILD_KILLED.findall(worker.log())) == MAX_DELIVERIES, worker.log()[-3000:]

    entry = job_context().dead_letters.get(entry_id)
    assert entry is not None
    assert entry["reason"] == "poison"
    assert entry["errorType"] == "PoisonTurn"
    assert entry["taskId"] == result.id
    assert entry["conversationId"] == "poison-1"
    assert entry["agent"] == "crasher"
    assert f"started {MAX_DELIVERIES} times" in entry["error"]
    assert [e["id"] for e in job_context().dead_letters.list_entries()] == [entry_id]

    # And the worker is alive (with a fresh pool child) and serves the next turn
    assert worker.alive()
    assert children_of(worker.pid) and children_of(worker.pid) != first_child
    reply = run_turn.delay(
        agent="demo", conversation_id="poison-2", message="after the poison rounds:1"
    ).get(timeout=20)
    assert reply["content"] == "Done: after the poison rounds:1"
    assert reply["attempts"] == 1
