"""People in the loop (docs/operations.md, "People in the loop"), against real workers, the pump
and Redis: a turn pauses for a person's decision, holds its conversation's place and no worker,
survives every process being killed, and resumes by turn id and request id alone."""

from __future__ import annotations

import signal
import time
import uuid
from types import MappingProxyType
from typing import Any

import orjson
import pytest
from celery.result import AsyncResult

from tasks import (
    ActionConflict,
    PendingAction,
    TurnCancelled,
    TurnDeadLettered,
    TurnState,
    answer_question,
    approve_action,
    cancel_turn,
    iter_events,
    reject_action,
    run_turn,
    turn_status,
)
from tasks.testing import wait_until
from tests.tasks.conftest import drop_client_connections


def submit(mode: str, conversation_id: str | None = None, **options: Any) -> tuple[Any, str]:
    tag = uuid.uuid4().hex[:8]
    result = run_turn.delay(
        agent="person",
        conversation_id=conversation_id or f"c-{tag}",
        message=f"{tag} {mode}",
        **options,
    )
    return result, tag


def paused(turn_id: str, timeout_s: float = 20) -> tuple[PendingAction, ...]:
    def is_paused() -> bool:
        status = turn_status(turn_id)
        return status is not None and status.state is TurnState.PAUSED

    wait_until(is_paused, timeout_s, f"turn {turn_id} to pause")
    status = turn_status(turn_id)
    assert status is not None
    return status.pending


def runs(jobs: Any, tag: str) -> list[str]:
    return [r.decode() for r in jobs.redis.lrange(f"pause:{tag}:runs", 0, -1)]


def model_calls(jobs: Any, tag: str) -> int:
    return int(jobs.redis.get(f"pause:{tag}:model") or 0)


def event_types(turn_id: str) -> list[str]:
    return [e.type for e in iter_events(turn_id, block_s=0)]


def test_approve_runs_the_call_once_and_the_model_is_not_asked_again(jobs: Any) -> None:
    result, tag = submit("refund")
    [action] = paused(result.id)
    # the other call of the response ran before the pause; the refund waits
    assert runs(jobs, tag) == ["lookup A"]
    assert (action.kind, action.tool, action.tool_call_id) == ("approval", "refund", "c2")
    assert dict(action.args) == {"order_id": "A", "tag": tag}
    assert action.expires_at > action.requested_at
    # Celery sees it too, with what it waits for
    celery = AsyncResult(result.id)
    assert celery.state == "PAUSED"
    assert celery.info["pending"][0]["requestId"] == action.request_id

    assert approve_action(result.id, action.request_id, actor="ops@example.com") is True
    reply = result.get(timeout=30)
    assert reply["content"] == "done: A shipped | refunded A"
    assert runs(jobs, tag) == ["lookup A", "refund A"]
    assert model_calls(jobs, tag) == 2
    # deciding again the same way is harmless; otherwise it is a conflict
    assert approve_action(result.id, action.request_id, actor="someone else") is False
    with pytest.raises(ActionConflict, match="already decided otherwise"):
        reject_action(result.id, action.request_id, message="no")

    types = event_types(result.id)
    assert types.index("turn.paused") < types.index("action.decided") < types.index("turn.resumed")
    assert types.count("turn.started") == 2 and types[-1] == "turn.succeeded"
    decided = next(e for e in iter_events(result.id, block_s=0) if e.type == "action.decided")
    assert decided.data == {
        "requestId": action.request_id,
        "decision": "approve",
        "actor": "ops@example.com",
    }


def test_approve_with_edited_args_runs_the_edited_call(jobs: Any) -> None:
    result, tag = submit("refund")
    [action] = paused(result.id)
    with pytest.raises(ActionConflict, match="mapping"):
        approve_action(result.id, action.request_id, edited_args=["B"])  # type: ignore[arg-type]
    approve_action(result.id, action.request_id, edited_args={"order_id": "B", "tag": tag})
    assert result.get(timeout=30)["content"] == "done: A shipped | refunded B"
    assert runs(jobs, tag) == ["lookup A", "refund B"]


def _nested(depth: int) -> Any:
    value: Any = "A"
    for _ in range(depth):
        value = [value]
    return value


class _Order:
    pass


NOT_JSON = [
    pytest.param({"order_id": {"A", "B"}}, "edited_args holds a set", id="set"),
    pytest.param({"order_id": b"A"}, "edited_args holds a bytes", id="bytes"),
    pytest.param({"order_id": _Order()}, "edited_args holds a _Order", id="object"),
    pytest.param({"order_id": {1: "A"}}, "holds an object key that is not a string", id="int-key"),
    pytest.param({"amount": float("nan")}, "holds a NaN or infinite number", id="nan"),
    pytest.param({"amount": float("inf")}, "holds a NaN or infinite number", id="inf"),
    pytest.param({"amount": [float("-inf")]}, "holds a NaN or infinite number", id="-inf"),
    pytest.param({"amount": 2**64}, "holds an integer beyond 64 bits", id="big-int"),
    pytest.param({"amount": -(2**63) - 1}, "holds an integer beyond 64 bits", id="big-negative"),
    pytest.param({"order_id": _nested(100)}, "is nested deeper than 64 levels", id="deep"),
    pytest.param(
        {"order_id": "A\ud800"}, "holds a string that is not valid Unicode", id="surrogate"
    ),
    pytest.param({"order_id": MappingProxyType({"a": 1})}, "edited_args is not JSON", id="proxy"),
]


def _turn_data(jobs: Any, turn_id: str) -> dict[bytes, Any]:
    """Every hash and stream of the turn (its record, its events), by key."""
    found: dict[bytes, Any] = {}
    for key in jobs.redis.scan_iter(match=f"*{turn_id}*"):
        kind = jobs.redis.type(key)
        if kind == b"hash":
            found[key] = jobs.redis.hgetall(key)
        elif kind == b"stream":
            found[key] = jobs.redis.xrange(key)
    return found


@pytest.mark.parametrize(("edited_args", "problem"), NOT_JSON)
def test_approve_refuses_edited_args_that_are_not_json_and_changes_nothing(
    jobs: Any, edited_args: dict[Any, Any], problem: str
) -> None:
    # Given a turn paused for an approval
    result, tag = submit("refund")
    [action] = paused(result.id)
    before = _turn_data(jobs, result.id)
    assert before, "the sweep must see the turn's record"

    # When a person approves it with arguments JSON cannot carry exactly
    with pytest.raises(ActionConflict) as refused:
        approve_action(result.id, action.request_id, edited_args=edited_args)

    # Then the refusal is typed and says what is wrong and what to do, and nothing changed
    assert refused.value.code == "ERR_ACTION_CONFLICT"
    assert problem in str(refused.value)
    assert "send JSON values only" in str(refused.value)
    assert _turn_data(jobs, result.id) == before
    assert [p.request_id for p in paused(result.id)] == [action.request_id]
    # and a correct approval afterwards still runs the edited call
    assert approve_action(result.id, action.request_id, edited_args={"order_id": "B", "tag": tag})
    assert result.get(timeout=30)["content"] == "done: A shipped | refunded B"
    assert runs(jobs, tag) == ["lookup A", "refund B"]


def test_reject_tells_the_model_and_runs_nothing(jobs: Any) -> None:
    result, tag = submit("refund")
    [action] = paused(result.id)
    assert reject_action(result.id, action.request_id, message="over the limit") is True
    assert result.get(timeout=30)["content"] == "done: A shipped | [rejected] over the limit"
    assert runs(jobs, tag) == ["lookup A"]


def test_a_question_is_answered_verbatim_and_only_by_answer_question(jobs: Any) -> None:
    result, _ = submit("ask")
    [question] = paused(result.id)
    assert (question.kind, question.question) == ("question", "Which order?")
    with pytest.raises(ActionConflict, match="answer_question or reject_action, not approve_"):
        approve_action(result.id, question.request_id)
    with pytest.raises(ActionConflict, match="never pending"):
        answer_question(result.id, "req-made-up", "A")
    assert answer_question(result.id, question.request_id, "  A-17, the blue one ") is True
    assert result.get(timeout=30)["content"] == "done:   A-17, the blue one "


def test_an_approval_callable_lets_small_calls_through_and_pauses_big_ones(jobs: Any) -> None:
    small, tag = submit("credit:20")
    assert small.get(timeout=30)["content"] == "done: credited 20"
    assert runs(jobs, tag) == ["credit 20"]
    big, big_tag = submit("credit:500")
    [action] = paused(big.id)
    assert action.tool == "credit" and runs(jobs, big_tag) == []
    approve_action(big.id, action.request_id)
    assert big.get(timeout=30)["content"] == "done: credited 500"


def test_a_paused_turn_holds_its_conversations_place_but_no_worker(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.worker(concurrency=1)  # one slot: a pause that held it would stall the other turn
    jobs.pump()
    first, _ = submit("refund", conversation_id="c-order")
    [action] = paused(first.id)
    second, second_tag = submit("credit:5", conversation_id="c-order")
    other, _ = submit("credit:7")  # another conversation runs meanwhile
    assert other.get(timeout=30)["content"] == "done: credited 7"
    time.sleep(1.0)
    status = turn_status(second.id)
    assert status is not None and status.state is TurnState.QUEUED
    assert status.queued_behind == first.id
    assert runs(jobs, second_tag) == []
    approve_action(first.id, action.request_id)
    assert first.get(timeout=30)["turnNumber"] == 1
    assert second.get(timeout=30)["turnNumber"] == 2


def test_a_pause_survives_every_process_and_redis_being_killed(
    make_jobs: Any, redis_server: Any
) -> None:
    jobs = make_jobs()
    worker, pump = jobs.worker(), jobs.pump()
    result, tag = submit("refund")
    [action] = paused(result.id)
    worker.kill(signal.SIGKILL)
    pump.kill(signal.SIGKILL)
    redis_server.restart()  # appendonly: what was written survives
    drop_client_connections()
    # the decision is made while nothing runs
    assert approve_action(result.id, action.request_id) is True
    jobs.worker()
    jobs.pump()
    assert result.get(timeout=60)["content"] == "done: A shipped | refunded A"
    assert runs(jobs, tag) == ["lookup A", "refund A"]


def test_a_pause_nobody_decides_expires_as_pause_expired(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_PAUSE_TTL_S="1")
    jobs.worker()
    jobs.pump()
    result, tag = submit("refund")
    [action] = paused(result.id)
    with pytest.raises(TurnDeadLettered) as failed:
        result.get(timeout=30)
    assert failed.value.reason == "pause_expired"
    assert runs(jobs, tag) == ["lookup A"]
    with pytest.raises(ActionConflict, match="pause ended"):
        approve_action(result.id, action.request_id)


def test_cancel_ends_a_paused_turn(jobs: Any) -> None:
    result, tag = submit("refund")
    [action] = paused(result.id)
    assert cancel_turn(result.id, reason="customer left") is True
    with pytest.raises(TurnCancelled):
        result.get(timeout=10)
    with pytest.raises(ActionConflict, match="cancelled"):
        approve_action(result.id, action.request_id)
    assert runs(jobs, tag) == ["lookup A"]


def test_time_paused_does_not_count_toward_the_deadline(jobs: Any) -> None:
    result, _ = submit("refund", deadline_s=3)
    [action] = paused(result.id)
    time.sleep(4)  # longer than the whole deadline, all of it paused
    status = turn_status(result.id)
    assert status is not None and status.state is TurnState.PAUSED
    approve_action(result.id, action.request_id)
    assert result.get(timeout=30)["content"] == "done: A shipped | refunded A"


def test_the_command_line_lists_and_decides_pauses(jobs: Any) -> None:
    from tests.tasks.test_cli import cli

    refund, _ = submit("refund")
    question, _ = submit("ask")
    [approval] = paused(refund.id)
    [asked] = paused(question.id)
    listed = orjson.loads(cli("turn", "pending", "--json"))
    by_turn = {turn["turnId"]: turn["pending"] for turn in listed}
    assert by_turn[refund.id][0]["requestId"] == approval.request_id
    assert by_turn[question.id][0]["question"] == "Which order?"
    table = cli("turn", "pending")
    assert approval.request_id in table and "2 paused turns" in table
    assert "paused: waiting" in cli("turn", "show", refund.id)

    wrong = cli("turn", "approve", question.id, asked.request_id, exit_code=1)
    assert (
        "a question is decided with `agentjobs turn answer` or `agentjobs turn reject`, "
        "not `agentjobs turn approve`"
    ) in wrong
    assert "turn pending" in wrong and "answer_question" not in wrong
    edited = '{"order_id": "C", "tag": "cli"}'
    assert "approved" in cli("turn", "approve", refund.id, approval.request_id, "--args", edited)
    assert "already decided" in cli(
        "turn", "approve", refund.id, approval.request_id, "--args", edited
    )
    assert "answered" in cli("turn", "answer", question.id, asked.request_id, "the red one")
    assert refund.get(timeout=30)["content"] == "done: A shipped | refunded C"
    assert question.get(timeout=30)["content"] == "done: the red one"
    assert "no turn is waiting" in cli("turn", "pending")


def test_a_pause_mirrored_after_its_turn_ended_leaves_the_final_result(
    jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import states

    from tasks import app
    from tasks.queue.context import job_context
    from tasks.queue.results import PAUSED
    from tasks.turn import ending

    # Given a turn that succeeded
    result = run_turn.delay(agent="demo", conversation_id="c-late-mirror", message="hi")
    reply = result.get(timeout=30)
    ctx = job_context()
    record = ctx.records.find(result.id)
    assert record is not None
    # When its PAUSED mirror lands after the success: Celery's store read the key before the
    # success was there (its read and its write are two steps; the mixed soak hit this)
    backend = app.backend
    monkeypatch.setattr(backend, "_get_task_meta_for", lambda task_id: {"status": states.PENDING})
    ending.mirror_state(ctx, record, PAUSED, {"state": "paused", "pending": []})
    monkeypatch.undo()
    # Then the turn's Celery result is its success again
    after = AsyncResult(result.id, app=app)
    assert after.state == states.SUCCESS and after.get(timeout=5) == reply
