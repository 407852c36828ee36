"""Guarantees 1 and 2 (docs/jobs.md): nothing is lost, and turns of one conversation run one
at a
time in submission order, against a real Redis and real worker processes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from celery.result import AsyncResult

from tasks import TurnDeadLettered, app, load_conversation, run_turn
from tasks.queue.context import job_context
from tasks.testing import wait_until


def outcome(result: AsyncResult, timeout_s: float = 60) -> tuple[str, Any]:
    try:
        return "succeeded", result.get(timeout=timeout_s)
    except TurnDeadLettered as exc:
        return "dead_lettered", exc


def test_every_turn_ends_exactly_once_and_its_checkpoint_can_be_read(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="3")
    jobs.worker(concurrency=16)
    jobs.worker(name="w2", concurrency=16)
    jobs.pump()
    rng = random.Random(7)
    plan = []
    for index in range(40):
        kind = rng.choice(["ok", "ok", "flaky", "auth", "exhausted"])
        directive = {
            "ok": "rounds:1",
            "flaky": "rounds:1 fail:503x1",
            "auth": "fail:401",
            "exhausted": "fail:503x9",
        }[kind]
        conversation = f"c-{index % 8}"
        plan.append(
            (
                kind,
                run_turn.delay(
                    agent="demo", conversation_id=conversation, message=f"turn {index} {directive}"
                ),
            )
        )

    records = job_context().records
    dead_letters = job_context().dead_letters
    for kind, result in plan:
        ending, value = outcome(result)
        assert ending == ("dead_lettered" if kind in ("auth", "exhausted") else "succeeded"), kind
        record = records.get(result.id)
        assert record is not None and record.state == ending
        if ending == "dead_lettered":
            expected_reason = "non_resumable" if kind == "auth" else "max_attempts"
            assert value.reason == expected_reason
            entry = dead_letters.get(value.entry_id)
            assert entry is not None and entry["taskId"] == result.id
            assert entry["checkpoint"]["history"][-1]["content"].startswith("turn ")
        else:
            assert value["attempts"] == (2 if kind == "flaky" else 1)
    entries = dead_letters.list_entries()
    assert len(entries) == sum(1 for kind, _ in plan if kind in ("auth", "exhausted"))
    for index in range(8):
        stored = load_conversation(f"c-{index}")
        succeeded = [r for (kind, r) in plan[index::8] if kind in ("ok", "flaky")]
        users = [m["content"] for m in stored.history if m["role"] == "user"] if stored else []
        assert len(users) == len(succeeded)


def test_turns_of_one_conversation_run_in_submission_order(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.worker(concurrency=16)
    jobs.pump()
    # The first turn fails twice and waits out two backoffs; the others must wait for it.
    messages = ["first think:0.2 fail:503x2 rounds:1"] + [
        f"turn {n} think:0.1 rounds:1" for n in range(2, 7)
    ]
    results = [run_turn.delay(agent="demo", conversation_id="ordered", message=m) for m in messages]
    replies = [r.get(timeout=60) for r in results]
    assert [r["turnNumber"] for r in replies] == [1, 2, 3, 4, 5, 6]
    stored = load_conversation("ordered")
    assert stored is not None
    assert [m["content"] for m in stored.history if m["role"] == "user"] == messages
    assert len(stored.history) == 6 * 4  # user, tool call, tool result, answer: nothing twice
    records = job_context().records
    spans = []
    for result in results:
        record = records.get(result.id)
        assert record is not None
        spans.append((record.created_at_ms, record.finished_at_ms))
    for (_, previous_end), result in zip(spans, results[1:], strict=False):
        record = records.get(result.id)
        assert record is not None
        assert record.started_at_ms >= previous_end, "a later turn overlapped"


def test_other_conversations_do_not_wait_for_a_retrying_one(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="6", AGENTJOBS_BACKOFF_MAX_S="10")
    jobs.worker(concurrency=8)
    jobs.pump()
    slow = run_turn.delay(agent="demo", conversation_id="slow", message="x fail:503x1")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(slow.id)) is not None and r.state == "waiting", 10, "a retry"
    )
    fast = run_turn.delay(agent="demo", conversation_id="fast", message="y")
    assert fast.get(timeout=10)["content"] == "Done: y"
    assert records.get(slow.id).state == "waiting"  # type: ignore[union-attr]


@pytest.mark.parametrize("identity_b", [{"tenant": "beta"}, {"tenant": "beta", "principal": "u"}])
def test_two_tenants_with_one_conversation_id_never_share_history(
    jobs: Any, identity_b: dict[str, str]
) -> None:
    a = run_turn.delay(
        agent="demo", conversation_id="shared", message="from A", identity={"tenant": "acme"}
    )
    a.get(timeout=30)
    b = run_turn.delay(
        agent="demo", conversation_id="shared", message="from B", identity=identity_b
    )
    assert b.get(timeout=30)["turnNumber"] == 1
    stored_b = load_conversation("shared", identity_b)
    stored_a = load_conversation("shared", {"tenant": "acme"})
    assert stored_a is not None and stored_b is not None
    assert [m["content"] for m in stored_b.history] == ["from B", "Done: from B"]
    assert [m["content"] for m in stored_a.history] == ["from A", "Done: from A"]
    assert stored_b.identity == {**identity_b, "conversationId": "shared"}


def test_a_result_the_worker_could_not_store_is_written_by_the_pump(
    make_jobs: Any, redis_server: Any
) -> None:
    # A result backend the processes do not take for the state Redis (the same server under
    # another name): Celery writes a success's result after the task, and the pump confirms
    # it (a result written by the script that ends the turn needs no confirming).
    other_name = redis_server.url.replace("127.0.0.1", "localhost")
    jobs = make_jobs(AGENTJOBS_RESULT_GRACE_S="2", CELERY_RESULT_BACKEND=other_name)
    jobs.worker()
    jobs.pump()
    done = run_turn.delay(agent="demo", conversation_id="r1", message="fine")
    refused = run_turn.delay(agent="demo", conversation_id="r2", message="no fail:401")
    expected = done.get(timeout=30)
    assert outcome(refused)[0] == "dead_lettered"
    # As if Redis had lost both results between the turn's end and Celery's write.
    backend = app.backend
    jobs.redis.delete(backend.get_key_for_task(done.id), backend.get_key_for_task(refused.id))
    wait_until(
        lambda: (
            jobs.redis.exists(backend.get_key_for_task(done.id))
            and jobs.redis.exists(backend.get_key_for_task(refused.id))
        ),
        10,
        "the pump to write the missing results",
    )
    assert AsyncResult(done.id, app=app).get(timeout=5) == expected
    with pytest.raises(TurnDeadLettered) as caught:
        AsyncResult(refused.id, app=app).get(timeout=5)
    assert caught.value.reason == "non_resumable"
    assert caught.value.entry_id == f"dl-{refused.id}"
