"""The one rule of the hard edges, fuzzed (docs/operations.md, "Hard edges"): whatever a
caller passes, the answer is a clear typed error or a turn that ends; a refused request stores
nothing; no other turn changes; every shared process stays up. Real worker, pump and Redis."""

from __future__ import annotations

import math
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks import (
    ActionConflict,
    InvalidTurnRequest,
    TurnDeadLettered,
    TurnState,
    approve_action,
    run_turn,
    turn_status,
)
from tasks.queue.context import job_context
from tasks.testing import wait_until

# Values a careless or hostile caller may pass where JSON is expected.
anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.binary(max_size=4)
    | st.sampled_from(["\ud800", "x" * 300, "_", "a/b", "%2F"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6) | st.integers(0, 3), inner, max_size=3)
        | st.frozensets(st.integers(0, 3), max_size=2)
        | st.tuples(inner)
    ),
    max_leaves=10,
)
turn_ids = (
    st.none()
    | st.text(max_size=8)
    | st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
    | st.sampled_from(["", " ", "x" * 200, "x" * 201, "sentinel-turn", "tab\t", "é"])
    | st.integers()
)
identities = st.none() | st.fixed_dictionaries(
    {}, optional={"tenant": st.text(max_size=5) | anything, "principal": anything, "x": anything}
)
valid_requests = st.fixed_dictionaries(
    {
        "agent": st.sampled_from(["demo", "nobody"]),
        "conversation_id": st.text(min_size=1, max_size=8),
        "message": st.text(min_size=1, max_size=20),
    },
    optional={
        "identity": st.fixed_dictionaries(
            {}, optional={"tenant": st.text(max_size=5), "principal": st.text(max_size=5)}
        ),
        "deadline_s": st.floats(0.5, 3600),
        "message_from": st.just("person"),
    },
)
FIELDS = ["agent", "conversation_id", "message", "identity", "message_from", "deadline_s", "time"]
# A valid request with one field (or an unknown one) replaced by anything at all.
broken_requests = st.tuples(
    valid_requests, st.sampled_from([*FIELDS, "surprise"]), anything | identities
).map(lambda t: {**t[0], t[1]: t[2]})
requests = valid_requests | broken_requests | st.dictionaries(st.sampled_from(FIELDS), anything)

SENTINEL = {"tenant": "sentinel-co", "principal": "owner"}


def _sentinel(jobs: Any) -> tuple[Any, bytes]:
    """A turn of another tenant, ended, whose record and result must not change."""
    result = run_turn.apply_async(
        kwargs={
            "agent": "demo",
            "conversation_id": "keep",
            "message": "mine",
            "identity": SENTINEL,
        },
        task_id="sentinel-turn",
    )
    result.get(timeout=30)
    record = job_context().records.get(result.id)
    assert record is not None
    key = job_context().keys.for_namespace(record.namespace).turn(result.id)
    return result, _dump(jobs, key)


def _dump(jobs: Any, key: str) -> bytes:
    return repr(sorted(jobs.redis.hgetall(key).items())).encode()


def _submitted(jobs: Any) -> set[bytes]:
    """The keys a submission creates (record, queue, events); the worker, busy with earlier
    turns meanwhile, only ends or removes these, never makes one."""
    return {
        k for k in jobs.redis.keys("*") if b":turn:" in k or b":queue:" in k or b":events:" in k
    }


def test_fuzzed_submissions_are_refused_cleanly_or_run(jobs: Any) -> None:
    sentinel, sentinel_record = _sentinel(jobs)
    accepted: list[Any] = []

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(requests, turn_ids)
    def one(kwargs: dict[str, Any], task_id: Any) -> None:
        before = _submitted(jobs)
        try:
            result = run_turn.apply_async(kwargs=kwargs, task_id=task_id)
        except InvalidTurnRequest as exc:
            assert exc.field and str(exc).startswith("run_turn: ")
            assert _submitted(jobs) <= before, f"a refused request stored something: {kwargs!r}"
            return
        accepted.append(result)

    one()
    assert accepted, "no fuzzed request was valid: the strategy is too narrow"
    for result in accepted:
        try:
            result.get(timeout=30)
        except TurnDeadLettered as exc:
            # What only the agent can judge (an unknown name, a `time` it has no layer for)
            # is the worker's to refuse, by the dead-letter path.
            assert exc.reason in {"unknown_agent", "bad_payload", "deadline_exceeded"}, exc
    key = job_context().keys.for_namespace("sentinel-co/owner/keep").turn(sentinel.id)
    assert _dump(jobs, key) == sentinel_record
    assert sentinel.get(timeout=5)["content"] == "Done: mine"
    assert all(p.alive() for p in jobs.processes)


def _json_exact(value: Any, depth: int = 0) -> bool:
    """Whether `value` round-trips through JSON exactly (what edited_args may be)."""
    if depth > 64:
        return False
    if value is None or isinstance(value, bool | str):
        return not isinstance(value, str) or value.encode(errors="ignore").decode() == value
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):  # a tuple is sent as a list, as Celery sends it
        return all(_json_exact(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_exact(v, depth + 1) for k, v in value.items())
    return False


def test_fuzzed_edited_args_are_refused_cleanly_or_recorded(jobs: Any) -> None:
    result = run_turn.delay(agent="person", conversation_id="fuzz-approve", message="f1 refund")
    wait_until(
        lambda: (s := turn_status(result.id)) is not None and s.state is TurnState.PAUSED,
        20,
        "the turn to pause",
    )
    status = turn_status(result.id)
    assert status is not None
    request_id = status.pending[0].request_id
    record = job_context().records.get(result.id)
    assert record is not None
    key = job_context().keys.for_namespace(record.namespace).turn(result.id)
    paused_record = _dump(jobs, key)

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.dictionaries(st.text(max_size=6), anything, max_size=3) | anything)
    def one(edited: Any) -> None:
        if edited is None or (isinstance(edited, dict) and _json_exact(edited)):
            return  # a valid approve would end the pause: one runs below
        try:
            approve_action(result.id, request_id, edited_args=edited)
        except (ActionConflict, InvalidTurnRequest) as exc:
            assert str(exc)
        else:
            raise AssertionError(f"edited_args {edited!r} were recorded")
        assert _dump(jobs, key) == paused_record, "a refused approve changed the turn"

    one()
    assert approve_action(result.id, request_id, edited_args={"order_id": "A", "tag": "f1"})
    assert isinstance(result.get(timeout=30)["content"], str)
    assert all(p.alive() for p in jobs.processes)


json_bodies = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
# Bodies near Celery's shape ([args, kwargs, embed]) and far from it, raw bytes, other types.
message_bodies = st.one_of(
    st.tuples(
        st.lists(json_bodies, max_size=4),
        st.dictionaries(st.text(max_size=6), json_bodies, max_size=4),
        st.none() | json_bodies,
    ).map(list),
    st.tuples(json_bodies, json_bodies, json_bodies).map(list),
    json_bodies,
    st.binary(max_size=24),
)
content_types = st.sampled_from(
    ["application/json", "application/x-orjson", "application/x-python-serialize", "text/plain"]
)
message_ids = st.none() | turn_ids.filter(lambda t: t is not None) | st.just("sentinel-turn")


def test_fuzzed_broker_messages_never_stop_a_worker_or_touch_another_turn(jobs: Any) -> None:
    from tests.tasks.test_bad_messages import publish

    sentinel, sentinel_record = _sentinel(jobs)
    sent: list[str] = []

    @settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        st.sampled_from(["tasks.run_turn", "tasks.resume_turn"]),
        message_bodies,
        content_types,
        message_ids,
    )
    def one(task: str, body: Any, content_type: str, turn_id: Any) -> None:
        # Bytes as they are; anything else as JSON bytes, whatever the content type says.
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        publish(jobs, data, task=task, turn_id=turn_id, content_type=content_type, raw=True)
        sent.append(task)

    one()
    # Each message was taken (none left in the queue) and the worker is still the same one.
    wait_until(
        lambda: jobs.redis.llen("agentjobs.turns") == 0, 60, "the worker to take every message"
    )
    healthy = run_turn.delay(agent="demo", conversation_id="after-fuzz", message="still here")
    assert healthy.get(timeout=30)["content"] == "Done: still here"
    key = job_context().keys.for_namespace("sentinel-co/owner/keep").turn(sentinel.id)
    assert _dump(jobs, key) == sentinel_record
    assert sentinel.get(timeout=5)["content"] == "Done: mine"
    assert all(p.alive() for p in jobs.processes), jobs.logs()[-3000:]
    assert "Unrecoverable error" not in jobs.logs()
    dropped = int(jobs.redis.get(job_context().keys.bad_messages) or 0)
    assert 0 < dropped <= len(sent), "the fuzz must reach the unreadable-message path"
