"""Hard edges (docs/operations.md, "Hard edges"): no value, id or record a caller or a damaged
store can hand the job system stops a shared process or reaches into another tenant's turn.
Every test runs against a real Redis with real worker and pump processes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tasks import (
    InvalidTurnRequest,
    TurnDeadLettered,
    TurnState,
    app,
    run_turn,
    turn_status,
)
from tasks.queue.context import job_context
from tasks.testing import wait_until
from tasks.turn.ending import replay_dead_letter

A = {"tenant": "acme", "principal": "u-1"}
B = {"tenant": "beta", "principal": "u-9"}


def _stored_keys(jobs: Any) -> set[bytes]:
    return set(jobs.redis.keys("*"))


# -- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deadline_s", [1e15, float("inf"), float("nan"), 0, -1, 8 * 24 * 3600, "10", True]
)
def test_an_out_of_range_deadline_is_refused_before_anything_is_stored(
    make_jobs: Any, deadline_s: Any
) -> None:
    jobs = make_jobs()
    before = _stored_keys(jobs)
    with pytest.raises(InvalidTurnRequest) as refused:
        run_turn.delay(agent="demo", conversation_id="c1", message="hi", deadline_s=deadline_s)
    assert refused.value.field == "deadline_s"
    assert "deadline_s" in str(refused.value)
    assert _stored_keys(jobs) - before <= {b"agentjobs:epoch"}


def test_a_sub_second_deadline_is_honoured_and_stored_as_whole_ms(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.pump()  # no worker: the turn can only end by its deadline
    result = run_turn.delay(agent="demo", conversation_id="c1", message="hi", deadline_s=0.0001)
    record = job_context().records.get(result.id)
    assert record is not None and record.deadline_at_ms > 0
    raw = jobs.redis.hget(
        job_context().keys.for_namespace(record.namespace).turn(result.id), "deadline_at_ms"
    )
    assert raw is not None and raw.isdigit()
    with pytest.raises(TurnDeadLettered) as ended:
        result.get(timeout=20)
    assert ended.value.reason == "deadline_exceeded"


def test_identity_extras_that_are_not_plain_json_are_refused(make_jobs: Any) -> None:
    make_jobs()
    nested: Any = "x"
    for _ in range(300):
        nested = {"n": nested}
    for extra in (nested, 10**30, float("nan"), {1: "int key"}, {"s": {1, 2}}, "\ud800"):
        with pytest.raises(InvalidTurnRequest) as refused:
            run_turn.delay(
                agent="demo", conversation_id="c1", message="hi", identity={**A, "extra": extra}
            )
        assert refused.value.field == "identity"


# -- turn ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task_id", ["", " ", "has space", "tab\tid", "é-accent", "x" * 201, "nl\n"]
)
def test_a_malformed_turn_id_is_refused_before_anything_is_stored(
    make_jobs: Any, task_id: str
) -> None:
    jobs = make_jobs()
    before = _stored_keys(jobs)
    with pytest.raises(InvalidTurnRequest) as refused:
        run_turn.apply_async(
            kwargs={"agent": "demo", "conversation_id": "c1", "message": "hi"}, task_id=task_id
        )
    assert refused.value.field == "task_id"
    assert _stored_keys(jobs) - before <= {b"agentjobs:epoch"}


def test_the_longest_allowed_turn_id_runs(jobs: Any) -> None:
    turn_id = "t" * 199 + "~"
    result = run_turn.apply_async(
        kwargs={"agent": "demo", "conversation_id": "c1", "message": "hi"}, task_id=turn_id
    )
    assert result.get(timeout=30)["content"] == "Done: hi"


def _a_turn_of_tenant_a(turn_id: str | None = None) -> Any:
    kwargs = {"agent": "demo", "conversation_id": "a-conv", "message": "A's words", "identity": A}
    if turn_id is None:
        return run_turn.delay(**kwargs)
    return run_turn.apply_async(kwargs=kwargs, task_id=turn_id)


@pytest.mark.parametrize("chosen", [True, False], ids=["chosen-id", "generated-id"])
def test_another_tenant_cannot_submit_a_known_turn_id(jobs: Any, chosen: bool) -> None:
    a = _a_turn_of_tenant_a("order-77" if chosen else None)
    assert a.get(timeout=30)["content"] == "Done: A's words"
    with pytest.raises(InvalidTurnRequest) as refused:
        run_turn.apply_async(
            kwargs={"agent": "demo", "conversation_id": "b-conv", "message": "B", "identity": B},
            task_id=a.id,
        )
    text = str(refused.value)
    assert refused.value.field == "task_id"
    for leaked in ("acme", "a-conv", "u-1"):
        assert leaked not in text
    status = turn_status(a.id)
    assert status is not None and status.conversation_id == "a-conv"
    assert app.AsyncResult(a.id).get(timeout=5)["content"] == "Done: A's words"


def test_a_message_sent_around_run_turn_with_a_taken_id_is_dropped(jobs: Any) -> None:
    a = _a_turn_of_tenant_a()
    a.get(timeout=30)
    # app.send_task skips the client's checks: the worker is the door here.
    app.send_task(
        "tasks.run_turn",
        kwargs={"agent": "demo", "conversation_id": "b-conv", "message": "B's", "identity": B},
        task_id=a.id,
        queue=jobs.env.get("AGENTJOBS_TURN_QUEUE", "agentjobs.turns"),
    )
    # ...and a bad-payload message with the same id, which would be dead-lettered elsewhere.
    app.send_task(
        "tasks.run_turn",
        kwargs={"agent": "demo", "conversation_id": "", "message": "B's"},
        task_id=a.id,
        queue=jobs.env.get("AGENTJOBS_TURN_QUEUE", "agentjobs.turns"),
    )
    wait_until(
        lambda: (
            "names a turn of another conversation" in jobs.logs()
            and jobs.logs().count("dropped: that id") >= 2
        ),
        20,
        "the worker to drop both messages",
    )
    status = turn_status(a.id)
    assert status is not None and status.state is TurnState.SUCCEEDED
    assert status.conversation_id == "a-conv"
    assert app.AsyncResult(a.id).get(timeout=5)["content"] == "Done: A's words"
    assert job_context().records.owner_of(a.id) == {"acme/u-1/a-conv"}
    # A later turn of B's runs as usual.
    b = run_turn.delay(agent="demo", conversation_id="b-conv", message="B again", identity=B)
    assert b.get(timeout=30)["content"] == "Done: B again"


def test_two_tenants_racing_for_one_new_id_get_one_turn(make_jobs: Any) -> None:
    jobs = make_jobs()
    records = job_context().records
    assert records.claim_turn_id("race-1", "acme/u-1/c")
    assert not records.claim_turn_id("race-1", "beta/u-9/c")
    assert records.claim_turn_id("race-1", "acme/u-1/c")  # the same conversation again
    jobs.redis.delete(job_context().keys.turn_id_owner("race-1"))
    assert records.claim_turn_id("race-1", "beta/u-9/c")  # free once nothing holds it


# -- replay ---------------------------------------------------------------------------------------


def test_a_replayed_dead_letter_starts_at_once_without_a_pump(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_STALL_AFTER_S="60")
    jobs.worker()  # no pump: nothing but the replay's own message can start it
    failed = run_turn.delay(agent="demo", conversation_id="c1", message="hi fail:401")
    with pytest.raises(TurnDeadLettered) as ended:
        failed.get(timeout=30)
    started = time.monotonic()
    replayed = replay_dead_letter(job_context(), ended.value.entry_id)
    wait_until(
        lambda: (s := turn_status(replayed.turn_id)) is not None and s.state.terminal,
        10,
        "the replayed turn to end",
    )
    assert time.monotonic() - started < 5
    record = job_context().records.get(replayed.turn_id)
    assert record is not None and record.started_at_ms - record.created_at_ms < 1000


# -- damaged records ------------------------------------------------------------------------------


def _plant_damaged_records(jobs: Any) -> list[str]:
    """Records no version of ours writes, in every index the pump sweeps, due now."""
    keys = job_context().keys
    namespace = next(f"x/y/c{n}" for n in range(1000) if keys.shard_of(f"x/y/c{n}") == 0)
    shard = keys.shard(0)
    now_ms = job_context().records.server_time_ms()
    planted = {
        "bad-attempt": {"state": "running", "attempt": "abc", "namespace": namespace},
        "bad-state": {"state": "exploded", "namespace": namespace},
        "no-state": {"namespace": namespace, "deadline_at_ms": "1"},
        "bad-payload-json": {"state": "queued", "payload": "{not json", "namespace": namespace},
    }
    for turn_id, fields in planted.items():
        jobs.redis.hset(shard.turn(turn_id), mapping=fields)
        for index in (shard.running, shard.deadlines, shard.pending, shard.pauses, shard.retries):
            jobs.redis.zadd(index, {turn_id: now_ms - 60_000})
        jobs.redis.zadd(shard.finished, {turn_id: now_ms - 60_000})
    jobs.redis.hset(keys.workers, "ghost@nowhere", b"{not a beat")
    return list(planted)


def test_damaged_records_stop_neither_the_pump_nor_other_turns(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.worker()
    pump = jobs.pump()
    planted = _plant_damaged_records(jobs)
    retried = run_turn.delay(agent="demo", conversation_id="c1", message="hi fail:503x1")
    overdue = run_turn.delay(
        agent="demo", conversation_id="c2", message="x rounds:1 slow:30", deadline_s=1
    )
    assert retried.get(timeout=30) == {**retried.get(timeout=1), "content": "Done: hi fail:503x1"}
    assert retried.get(timeout=1)["attempts"] == 2  # the pump woke the retry
    with pytest.raises(TurnDeadLettered) as ended:
        overdue.get(timeout=30)
    assert ended.value.reason == "deadline_exceeded"
    time.sleep(1.0)  # several more ticks over the damaged records
    assert pump.alive(), pump.log()[-3000:]
    log = pump.log()
    for turn_id in ("bad-attempt", "bad-state"):
        assert log.count(f"turn record '{turn_id}' is unreadable") == 1, log[-3000:]
    assert "Traceback" not in log or "could not be handled" in log
    from tasks.operate.inspect import stats

    figures = stats(job_context())
    assert set(figures["unreadableRecords"]["turnIds"]) >= {"bad-attempt", "bad-state"}
    assert set(figures["unreadableRecords"]["turnIds"]) <= set(planted)
    assert jobs.redis.hget(job_context().keys.workers, "ghost@nowhere") is None


def test_a_record_with_float_times_from_an_older_version_is_read(make_jobs: Any) -> None:
    jobs = make_jobs()
    shard = job_context().keys.shard(0)
    jobs.redis.hset(
        shard.turn("old-1"),
        mapping={"state": "succeeded", "deadline_at_ms": "1.0000017961523304e+18", "attempt": 1},
    )
    record = job_context().records.get("old-1")
    assert record is not None and record.deadline_at_ms == 1000001796152330368


# -- by-id calls with an identity -----------------------------------------------------------------


def _paused_refund_of_a(jobs: Any) -> tuple[Any, str]:
    from tasks import TurnState as S

    result = run_turn.delay(
        agent="person", conversation_id="a-refunds", message="t1 refund", identity=A
    )
    wait_until(
        lambda: (s := turn_status(result.id)) is not None and s.state is S.PAUSED,
        20,
        "A's turn to pause",
    )
    status = turn_status(result.id)
    assert status is not None
    return result, status.pending[0].request_id


def test_a_turn_of_another_tenant_is_unknown_to_a_caller_passing_its_identity(jobs: Any) -> None:
    from tasks import (
        ActionConflict,
        answer_question,
        approve_action,
        cancel_turn,
        iter_events,
        reject_action,
    )

    result, request_id = _paused_refund_of_a(jobs)
    status = turn_status(result.id)
    assert status is not None and (status.tenant, status.principal) == ("acme", "u-1")
    assert (status.pending[0].tenant, status.pending[0].principal) == ("acme", "u-1")
    # B knows the id and passes its own identity: the turn is as unknown as one never made.
    assert turn_status(result.id, identity=B) is None
    assert turn_status(result.id, identity={"tenant": "acme"}) is None  # principal differs
    with pytest.raises(LookupError) as unknown_events:
        list(iter_events(result.id, block_s=0, identity=B))
    with pytest.raises(LookupError) as never_events:
        list(iter_events("never-was", block_s=0, identity=B))
    assert str(unknown_events.value).replace(result.id, "ID") == str(never_events.value).replace(
        "never-was", "ID"
    )
    assert cancel_turn(result.id, identity=B) is False
    refusals = []
    for decide in (
        lambda t, r: approve_action(t, r, edited_args={"amount": 100000}, identity=B),
        lambda t, r: reject_action(t, r, message="no", identity=B),
        lambda t, r: answer_question(t, r, "yes", identity=B),
    ):
        with pytest.raises(ActionConflict) as refused:
            decide(result.id, request_id)
        with pytest.raises(ActionConflict) as never:
            decide("never-was", request_id)
        assert str(refused.value).replace(result.id, "ID") == str(never.value).replace(
            "never-was", "ID"
        )
        refusals.append(refused.value)
    # Nothing of A's turn changed; A, with its own identity, decides.
    after = turn_status(result.id)
    assert after is not None and after.state is TurnState.PAUSED and after.pending == status.pending
    assert approve_action(result.id, request_id, identity={**A, "conversationId": "a-refunds"})
    assert result.get(timeout=30)["conversationId"] == "a-refunds"


def test_without_an_identity_a_turn_id_is_a_capability(jobs: Any) -> None:
    from tasks import cancel_turn

    result, _ = _paused_refund_of_a(jobs)
    assert turn_status(result.id) is not None
    assert cancel_turn(result.id, reason="by id alone")
    status = turn_status(result.id)
    assert status is not None and status.state is TurnState.CANCELLED


# -- a store that refuses writes ------------------------------------------------------------------


def test_a_full_redis_never_makes_healthy_turns_poison(
    make_jobs: Any, redis_server: Any, tmp_path: Any
) -> None:
    """Redis at maxmemory (noeviction) on and off for a while, as when it hovers at its limit:
    small writes get through now and then, progress writes are refused. Every turn running
    then must end succeeded, none as poison, and no tool round may run twice."""
    import redis as redis_py

    jobs = make_jobs(TEST_RUNS_DIR=str(tmp_path))
    jobs.worker(concurrency=8)
    jobs.pump()
    tags = [f"t{n}" for n in range(8)]
    results = [
        run_turn.delay(agent="store_rounds", conversation_id=f"c-{tag}", message=f"{tag} rounds:8")
        for tag in tags
    ]
    wait_until(lambda: all((tmp_path / tag).exists() for tag in tags), 20, "every turn to start")
    admin = redis_py.Redis.from_url(redis_server.url)
    previous = admin.config_get("maxmemory*")
    admin.config_set("maxmemory-policy", "noeviction")
    refused_until = time.monotonic() + 12  # four 3 s leases
    try:
        while time.monotonic() < refused_until:
            admin.config_set("maxmemory", "1")
            time.sleep(2.5)
            admin.config_set("maxmemory", previous["maxmemory"])
            time.sleep(0.3)
    finally:
        admin.config_set("maxmemory", previous["maxmemory"])
        admin.config_set("maxmemory-policy", previous["maxmemory-policy"])
        admin.close()
    for tag, result in zip(tags, results, strict=True):
        assert result.get(timeout=90)["content"] == f"{tag} done after 8 steps"
    for tag, result in zip(tags, results, strict=True):
        starts = (tmp_path / tag).read_text().split()
        steps = [int(n) for n in starts[::2]]
        assert sorted(steps) == list(range(1, 9)), f"{tag}: steps ran {steps}"
        record = job_context().records.get(result.id)
        assert record is not None and record.state is TurnState.SUCCEEDED
        assert record.attempt == 1
    assert "poison" not in jobs.logs()


def test_the_cli_by_id_commands_take_the_identity(jobs: Any) -> None:
    from tests.tasks.test_cli import cli

    result, request_id = _paused_refund_of_a(jobs)
    wrong = ("--tenant", "beta", "--principal", "u-9")
    right = ("--tenant", "acme", "--principal", "u-1")
    unknown = cli("turn", "show", "never-was", exit_code=1)
    shown = cli("turn", "show", result.id, *wrong, exit_code=1)
    assert shown.replace(result.id, "ID") == unknown.replace("never-was", "ID")
    cli("turn", "cancel", result.id, *wrong, exit_code=1)
    cli(
        "turn",
        "approve",
        result.id,
        request_id,
        "--args",
        '{"amount": 100000}',
        *wrong,
        exit_code=1,
    )
    cli("turn", "reject", result.id, request_id, *wrong, exit_code=1)
    cli("turn", "watch", result.id, "--tenant", "beta", exit_code=1)
    status = turn_status(result.id)
    assert status is not None and status.state is TurnState.PAUSED
    assert "acme" not in shown and "a-refunds" not in shown
    assert "paused" in cli("turn", "show", result.id, *right)
    cli("turn", "approve", result.id, request_id, *right)
    assert result.get(timeout=30)["conversationId"] == "a-refunds"
