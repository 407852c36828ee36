"""Tools that do not run twice (docs/operations.md, "Tools that do not run twice"): a worker
SIGKILLed during a chosen call of a three-call response, against real workers and Redis. The
turn goes on on the other worker without a second model call for that response; completed
calls never run again; the interrupted one runs again with its key (idempotent) or becomes
`[outcome unknown]` (unsafe); sequential and parallel."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import orjson
import pytest

from agent import OUTCOME_UNKNOWN, AgentRunCheckpoint
from tasks import iter_events, load_conversation, run_turn, turn_status
from tasks.queue.context import job_context
from tasks.testing import wait_until


def starts(jobs: Any, tag: str) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in jobs.redis.lrange(f"journal:{tag}:starts", 0, -1)]


def model_calls(jobs: Any, tag: str) -> int:
    return int(jobs.redis.get(f"journal:{tag}:model") or 0)


def run_killed_turn(make_jobs: Any, agent: str, kill_at: int) -> tuple[Any, str, str, str]:
    """Two workers and the pump; the turn's first start of call `kill_at` kills its worker.
    Returns the jobs, the tag, the conversation id and the turn id once the turn succeeded."""
    jobs = make_jobs()
    first, second = jobs.worker(), jobs.worker()
    jobs.pump()
    tag, conversation_id = uuid.uuid4().hex[:8], f"c-{uuid.uuid4().hex[:8]}"
    result = run_turn.delay(
        agent=agent, conversation_id=conversation_id, message=f"{tag} kill:{kill_at}"
    )
    wait_until(lambda: not (first.alive() and second.alive()), 30, "a worker to be killed")
    reply = result.get(timeout=60)
    assert reply["content"] == "all paid"
    status = turn_status(result.id)
    assert status is not None and status.attempt == 1, "a crash is a redelivery, not a retry"
    return jobs, tag, conversation_id, result.id


def tool_messages(conversation_id: str) -> list[str]:
    stored = load_conversation(conversation_id)
    assert stored is not None
    # still AgentRunCheckpoint v1, as the reference runtime reads it
    assert AgentRunCheckpoint.from_json(stored.to_json()).version == 1
    return [m["content"] for m in stored.history if m["role"] == "tool"]


def by_call(seen: list[dict[str, Any]]) -> dict[int, list[tuple[str, int]]]:
    calls: dict[int, list[tuple[str, int]]] = {}
    for start in seen:
        calls.setdefault(start["n"], []).append((start["key"], start["attempt"]))
    return calls


@pytest.mark.parametrize(
    ("agent", "kill_at"),
    [
        ("journal_idempotent", 1),
        ("journal_idempotent", 2),
        ("journal_idempotent", 3),
        ("journal_parallel_idempotent", 2),
    ],
)
def test_an_interrupted_idempotent_call_runs_again_with_its_key(
    make_jobs: Any, agent: str, kill_at: int
) -> None:
    jobs, tag, conversation_id, _ = run_killed_turn(make_jobs, agent, kill_at)
    calls = by_call(starts(jobs, tag))
    # the response was kept: one model call for it, one for the answer
    assert model_calls(jobs, tag) == 2
    # every call ran once, the interrupted one twice: with the same key, attempts 1 and 2
    assert sorted(calls) == [1, 2, 3]
    for n, seen in calls.items():
        if n == kill_at:
            assert [attempt for _, attempt in seen] == [1, 2]
            assert seen[0][0] == seen[1][0]
        else:
            assert [attempt for _, attempt in seen] == [1], f"call {n} ran again"
    keys = {seen[0][0] for seen in calls.values()}
    assert len(keys) == 3, "each call has its own key"
    assert tool_messages(conversation_id) == ["paid 1", "paid 2", "paid 3"]


@pytest.mark.parametrize("agent", ["journal_unsafe", "journal_parallel_unsafe"])
def test_an_interrupted_unsafe_call_never_runs_twice(make_jobs: Any, agent: str) -> None:
    jobs, tag, conversation_id, _ = run_killed_turn(make_jobs, agent, kill_at=2)
    calls = by_call(starts(jobs, tag))
    assert model_calls(jobs, tag) == 2
    assert {n: len(seen) for n, seen in calls.items()} == {1: 1, 2: 1, 3: 1}
    contents = tool_messages(conversation_id)
    assert contents[0] == "paid 1" and contents[2] == "paid 3"
    assert contents[1].startswith(OUTCOME_UNKNOWN)


def test_the_journal_is_gone_once_the_turn_ends(make_jobs: Any) -> None:
    *_, turn_id = run_killed_turn(make_jobs, "journal_idempotent", kill_at=2)
    record = job_context().records.get(turn_id)
    assert record is not None
    assert (record.journal, record.frames) == ({}, ())


def test_a_deploy_hands_the_turn_over_between_calls_without_running_one_twice(
    make_jobs: Any,
) -> None:
    # Given two workers, the turn's call 2 taking 2 s on the first
    jobs = make_jobs()
    first = jobs.worker()
    tag, conversation_id = uuid.uuid4().hex[:8], f"c-{uuid.uuid4().hex[:8]}"
    result = run_turn.delay(
        agent="journal_unsafe", conversation_id=conversation_id, message=f"{tag} kill:0 slow:2"
    )
    wait_until(lambda: len(starts(jobs, tag)) == 2, 20, "call 2 to start")
    second = jobs.worker()

    # When the first worker is told to stop while call 2 runs
    first.kill(signal.SIGTERM)

    # Then it hands the turn over at call 3's start; the second worker goes on from the
    # journal: no second model call for the response, calls 1 and 2 not run again
    assert result.get(timeout=60)["content"] == "all paid"
    wait_until(lambda: not first.alive(), 20, "the stopped worker to exit")
    assert second.alive()
    assert model_calls(jobs, tag) == 2
    assert [(s["n"], s["attempt"]) for s in starts(jobs, tag)] == [(1, 1), (2, 1), (3, 1)]
    assert tool_messages(conversation_id) == ["paid 1", "paid 2", "paid 3"]
    types = [e.type for e in iter_events(result.id, block_s=0)]
    assert "turn.handed_over" in types
