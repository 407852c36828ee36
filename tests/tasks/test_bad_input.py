"""Guarantee 6 (docs/jobs.md): bad input never crashes a worker or loops. Each case ends as a
dead-letter entry with its reason and a clear message, and nothing else is touched."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent import AgentRunCheckpoint
from tasks import TurnDeadLettered, app, load_conversation, run_turn
from tasks.core.namespaces import namespace_for
from tasks.queue.context import job_context
from tasks.store.conversations import envelope_bytes
from tasks.testing import wait_until


def dead_letter_of(result: Any) -> TurnDeadLettered:
    with pytest.raises(TurnDeadLettered) as caught:
        result.get(timeout=30)
    return caught.value


def assert_worker_still_serves(conversation_id: str = "healthy") -> None:
    reply = run_turn.delay(agent="demo", conversation_id=conversation_id, message="still there?")
    assert reply.get(timeout=30)["content"] == "Done: still there?"


BAD_PAYLOADS = [
    pytest.param({"agent": "demo", "conversation_id": "c"}, "message", id="no-message"),
    pytest.param({"agent": "demo", "conversation_id": "c", "message": "  "}, "message", id="blank"),
    pytest.param({"agent": "demo", "conversation_id": "c", "message": 7}, "message", id="int"),
    pytest.param({"agent": "demo", "message": "hi"}, "conversation_id", id="no-conversation"),
    pytest.param(
        {"agent": "demo", "conversation_id": "c", "message": "hi", "colour": "red"},
        "colour",
        id="unknown-key",
    ),
    pytest.param(
        {"agent": "demo", "conversation_id": "c", "message": "hi", "identity": {"tenant": 5}},
        "identity.tenant",
        id="identity-type",
    ),
    pytest.param(
        {
            "agent": "demo",
            "conversation_id": "c",
            "message": "hi",
            "identity": {"conversationId": "other"},
        },
        "identity.conversationId",
        id="identity-conversation",
    ),
    pytest.param(
        {"agent": "demo", "conversation_id": "c", "message": "hi", "message_from": "robot"},
        "messageFrom",
        id="message-from",
    ),
    pytest.param(
        {"agent": "demo", "conversation_id": "c", "message": "hi", "time": {"zone": "UTC"}},
        "time",
        id="time-without-time-layer",
    ),
    pytest.param(
        {"agent": "demo", "conversation_id": "c", "message": "x" * 1_000_001},
        "message",
        id="huge-message",
    ),
]


def sent_around_run_turn_delay(*args: Any, **kwargs: Any) -> Any:
    """A message that does not come through run_turn.delay (which refuses bad requests at
    submission): another producer, an old client, a hand-written message."""
    return app.send_task("tasks.run_turn", args=list(args), kwargs=kwargs)


@pytest.mark.parametrize(("payload", "named"), BAD_PAYLOADS)
def test_a_bad_payload_is_dead_lettered_with_its_reason(
    jobs: Any, payload: dict[str, Any], named: str
) -> None:
    failed = dead_letter_of(sent_around_run_turn_delay(**payload))
    assert failed.reason == "bad_payload"
    entry = job_context().dead_letters.get(failed.entry_id)
    assert entry is not None and entry["reason"] == "bad_payload"
    assert named in entry["error"]
    assert entry["kwargs"] == payload
    assert load_conversation("c") is None, "a refused turn must not create a conversation"
    assert_worker_still_serves()


def test_positional_arguments_are_a_bad_payload(jobs: Any) -> None:
    failed = dead_letter_of(sent_around_run_turn_delay("demo", "c", "hi"))
    assert failed.reason == "bad_payload"
    assert_worker_still_serves()


def test_an_unknown_agent_is_dead_lettered_not_retried(jobs: Any) -> None:
    result = run_turn.delay(agent="nobody", conversation_id="c", message="hi")
    failed = dead_letter_of(result)
    assert failed.reason == "unknown_agent"
    assert "nobody" in str(failed)
    assert job_context().records.get(result.id).attempt == 1  # type: ignore[union-attr]
    broken = dead_letter_of(run_turn.delay(agent="broken", conversation_id="d", message="hi"))
    assert broken.reason == "agent_unavailable"
    assert "not an agent.Agent" in job_context().dead_letters.get(broken.entry_id)["error"]  # type: ignore[index]


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(b"\xff\xfe not json", id="bytes"),
        pytest.param(b'{"format": "flowchart-v1", "data": {}}', id="paused-run-format"),
        pytest.param(b'{"format": "conversation-v9", "data": {}}', id="unknown-format"),
        pytest.param(b"[1, 2]", id="not-an-envelope"),
    ],
)
def test_an_unreadable_stored_conversation_is_refused_by_name(jobs: Any, stored: bytes) -> None:
    key = job_context().store.key(namespace_for("c", None))
    jobs.redis.set(key, stored)
    failed = dead_letter_of(run_turn.delay(agent="demo", conversation_id="c", message="hi"))
    assert failed.reason == "unreadable_conversation"
    assert key in str(failed)
    assert jobs.redis.get(key) == stored, "the unreadable record must be left untouched"
    assert_worker_still_serves()


def test_an_invalid_stored_checkpoint_is_refused_and_kept(jobs: Any) -> None:
    key = job_context().store.key(namespace_for("c", None))
    envelope = orjson.dumps(
        {"format": "conversation-v1", "data": {"version": 2, "runId": "r"}, "savedAt": 1}
    )
    jobs.redis.set(key, envelope)
    failed = dead_letter_of(run_turn.delay(agent="demo", conversation_id="c", message="hi"))
    assert failed.reason == "invalid_checkpoint"
    assert "version" in str(failed)
    assert jobs.redis.get(key) == envelope
    assert_worker_still_serves()


def test_a_checkpoint_of_another_named_agent_is_a_mismatch(jobs: Any) -> None:
    first = run_turn.delay(agent="support", conversation_id="c", message="hello")
    first.get(timeout=30)
    before = jobs.redis.get(job_context().store.key(namespace_for("c", None)))
    failed = dead_letter_of(run_turn.delay(agent="billing", conversation_id="c", message="pay"))
    assert failed.reason == "conversation_mismatch"
    assert "support" in str(failed) and "billing" in str(failed)
    assert jobs.redis.get(job_context().store.key(namespace_for("c", None))) == before


def test_a_tampered_retry_checkpoint_is_dead_lettered(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="2")
    jobs.worker()
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="c", message="hi fail:503x1")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(result.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    waiting = records.get(result.id)
    assert waiting is not None
    turn_key = job_context().keys.for_namespace(waiting.namespace).turn(result.id)
    jobs.redis.hset(turn_key, "checkpoint", b'{"version":1}')
    failed = dead_letter_of(result)
    assert failed.reason == "invalid_checkpoint"
    assert "runId" in str(failed)
    assert_worker_still_serves()


def test_a_stored_conversation_of_another_tenant_is_not_served(jobs: Any) -> None:
    # A record whose own identity names another namespace (copied or tampered) is refused.
    foreign = AgentRunCheckpoint.from_dict(
        {
            "version": 1,
            "runId": "run-1-1",
            "history": [{"role": "user", "content": "secret of acme"}],
            "lastCompletedIteration": 1,
            "originalInput": {"message": "secret of acme"},
            "identity": {"tenant": "acme", "conversationId": "c"},
        }
    )
    key = job_context().store.key(namespace_for("c", {"tenant": "beta"}))
    jobs.redis.set(key, envelope_bytes(foreign))
    failed = dead_letter_of(
        run_turn.delay(agent="demo", conversation_id="c", message="hi", identity={"tenant": "beta"})
    )
    assert failed.reason == "unreadable_conversation"
    assert "another namespace" in str(failed)
