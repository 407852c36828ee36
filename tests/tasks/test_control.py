"""Stopping turns (docs/operations.md, "Cancel and deadlines"): cancel in each state, a whole
conversation, deadlines that end a turn stuck in a tool while the conversation goes on,
requests refused at submission, turn ids that cannot be taken over, agents whose factory
fails. Real workers, a real Redis."""

from __future__ import annotations

import signal
import time
from typing import Any

import orjson
import pytest

from tasks import (
    TurnDeadLettered,
    TurnState,
    app,
    iter_events,
    load_conversation,
    run_turn,
    turn_status,
)
from tasks.core.errors import InvalidTurnRequest, TurnCancelled
from tasks.operate.control import cancel_conversation, cancel_turn
from tasks.queue.context import job_context
from tasks.testing import wait_until

pytestmark = pytest.mark.integration


def state_of(turn_id: str) -> TurnState | None:
    status = turn_status(turn_id)
    return status.state if status else None


def test_cancelling_a_queued_turn_ends_it_at_once(make_jobs: Any) -> None:
    make_jobs()  # no worker: the turn stays queued
    result = run_turn.delay(agent="demo", conversation_id="c-q", message="never runs")
    assert cancel_turn(result.id, reason="changed my mind") is True
    started = time.monotonic()
    with pytest.raises(TurnCancelled) as cancelled:
        result.get(timeout=10)
    assert time.monotonic() - started < 2
    assert (cancelled.value.turn_id, cancelled.value.reason) == (result.id, "changed my mind")
    status = turn_status(result.id)
    assert status is not None and status.state is TurnState.CANCELLED
    assert status.cancel_reason == "changed my mind"
    events = list(iter_events(result.id, block_s=0))
    assert [e.type for e in events] == ["turn.queued", "turn.cancelled"]
    assert events[-1].data == {"reason": "changed my mind"}
    # Cancelling again, or an unknown turn, changes nothing
    assert cancel_turn(result.id) is False
    assert cancel_turn("no-such-turn") is False


def test_cancelling_a_waiting_turn_drops_its_retry_and_wakes_the_next(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="30", AGENTJOBS_BACKOFF_MAX_S="60")
    jobs.worker()
    jobs.pump()
    first = run_turn.delay(agent="demo", conversation_id="c-w", message="one fail:503x1")
    second = run_turn.delay(agent="demo", conversation_id="c-w", message="two")
    wait_until(lambda: state_of(first.id) is TurnState.WAITING, 10, "the retry")
    assert cancel_turn(first.id) is True
    assert second.get(timeout=15)["turnNumber"] == 1  # the cancelled turn added nothing
    ctx = job_context()
    record = ctx.records.get(first.id)
    assert record is not None and record.state is TurnState.CANCELLED
    shard = ctx.keys.for_namespace(record.namespace)
    assert ctx.redis.zscore(shard.retries, first.id) is None
    assert record.checkpoint, "its last checkpoint stays readable in its record"


def test_cancelling_a_running_turn_fences_out_its_worker(jobs: Any) -> None:
    # Given a turn in the middle of three slow tool rounds, and a later turn behind it
    slow = run_turn.delay(agent="demo", conversation_id="c-r", message="slow rounds:3 slow:1.5")
    later = run_turn.delay(agent="demo", conversation_id="c-r", message="later")
    wait_until(lambda: (s := turn_status(slow.id)) and s.iteration >= 2, 15, "round 2")
    # When it is cancelled
    assert cancel_turn(slow.id, reason="operator") is True
    # Then result.get() raises at once, not when the worker's tool returns
    started = time.monotonic()
    with pytest.raises(TurnCancelled):
        slow.get(timeout=10)
    assert time.monotonic() - started < 1.0
    # And the later turn runs on the conversation as it was: the cancelled turn added nothing
    assert later.get(timeout=20)["turnNumber"] == 1
    stored = load_conversation("c-r")
    assert stored is not None
    assert [m["content"] for m in stored.history if m["role"] == "user"] == ["later"]
    # And the stuck worker stopped at its next check point: no third round ever started
    time.sleep(2)
    types = [e.type for e in iter_events(slow.id, block_s=0)]
    assert types[-1] == "turn.cancelled"
    # (two rounds when the cancel came during round 2's tool, one when a slow machine let it in
    # before that tool started: either way the worker's check point stopped the run)
    assert 1 <= types.count("tool.started") <= 2
    record = job_context().records.get(slow.id)
    assert record is not None and record.state is TurnState.CANCELLED


def test_cancel_conversation_cancels_every_unfinished_turn(make_jobs: Any) -> None:
    make_jobs()
    results = [
        run_turn.delay(agent="demo", conversation_id="c-all", message=f"m{n}") for n in range(3)
    ]
    other = run_turn.delay(agent="demo", conversation_id="c-other", message="stays")
    assert cancel_conversation("c-all", reason="closed") == 3
    for result in results:
        with pytest.raises(TurnCancelled):
            result.get(timeout=5)
    assert state_of(other.id) is TurnState.QUEUED
    assert cancel_conversation("c-all") == 0


def test_a_turn_stuck_in_a_tool_is_ended_at_its_deadline_and_the_conversation_goes_on(
    make_jobs: Any,
) -> None:
    jobs = make_jobs()
    worker = jobs.worker()
    jobs.worker(name="w2")
    jobs.pump()
    # Given a turn whose tool sleeps ten minutes, with a 3 s deadline, and a turn behind it
    stuck = run_turn.delay(
        agent="demo", conversation_id="c-dl", message="hang rounds:1 slow:600", deadline_s=3
    )
    later = run_turn.delay(agent="demo", conversation_id="c-dl", message="after")
    submitted = time.monotonic()
    # Then it is dead-lettered as deadline_exceeded within a few seconds of its deadline
    with pytest.raises(TurnDeadLettered) as failed:
        stuck.get(timeout=20)
    assert failed.value.reason == "deadline_exceeded"
    assert 2.5 < time.monotonic() - submitted < 8
    # And the conversation moves on while the tool still sleeps
    assert later.get(timeout=20)["content"].startswith("Done: after")
    events = [e.type for e in iter_events(stuck.id, block_s=0)]
    assert events[-1] == "turn.dead_lettered"
    worker.kill(signal.SIGKILL)  # its thread is still in the tool


def test_bad_requests_are_refused_before_anything_is_queued(make_jobs: Any) -> None:
    jobs = make_jobs()
    bad_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("demo", "c", "hi"), {}),
        ((), {"agent": "demo", "conversation_id": "c"}),
        ((), {"agent": "demo", "conversation_id": "c", "message": ""}),
        ((), {"agent": "demo", "conversation_id": "c", "message": "hi", "colour": "red"}),
        ((), {"agent": "demo", "conversation_id": "c", "message": "hi", "identity": "acme"}),
        ((), {"agent": "demo", "conversation_id": "c", "message": "hi", "deadline_s": -1}),
        ((), {"agent": "", "conversation_id": "c", "message": "hi"}),
    ]
    for args, kwargs in bad_calls:
        with pytest.raises(InvalidTurnRequest) as refused:
            run_turn.delay(*args, **kwargs)
        assert isinstance(refused.value, ValueError) and refused.value.field
    assert jobs.redis.dbsize() == 0, "nothing was queued or recorded"


def test_a_turn_id_names_one_turn(jobs: Any) -> None:
    request = {"agent": "demo", "conversation_id": "c-id", "message": "once"}
    first = run_turn.apply_async(kwargs=request, task_id="my-turn-1")
    again = run_turn.apply_async(kwargs=request, task_id="my-turn-1")
    assert again.id == first.id == "my-turn-1"
    assert first.get(timeout=20) == again.get(timeout=5)
    with pytest.raises(InvalidTurnRequest, match="another request"):
        run_turn.apply_async(kwargs={**request, "message": "other"}, task_id="my-turn-1")
    with pytest.raises(InvalidTurnRequest, match="another conversation"):
        run_turn.apply_async(
            kwargs={**request, "conversation_id": "c-elsewhere"}, task_id="my-turn-1"
        )
    stored = load_conversation("c-id")
    assert stored is not None
    assert [m["content"] for m in stored.history if m["role"] == "user"] == ["once"]
    assert load_conversation("c-elsewhere") is None


def test_an_agent_whose_factory_fails_is_unavailable_not_unknown(jobs: Any) -> None:
    result = run_turn.delay(agent="raising", conversation_id="c-ua", message="hi")
    with pytest.raises(TurnDeadLettered) as failed:
        result.get(timeout=20)
    assert failed.value.reason == "agent_unavailable"
    assert "settings are missing" in str(failed.value)
    logs = jobs.logs()
    assert logs.count("agent 'raising' is unavailable") == 1, "logged once, at start"


def test_turn_watch_and_turn_cancel_on_the_command_line(make_jobs: Any) -> None:
    from click.testing import CliRunner

    from tasks.cli import main
    from tests.tasks.test_cli import cli

    jobs = make_jobs()
    jobs.worker()
    done = run_turn.delay(agent="demo", conversation_id="c-cli", message="hello rounds:1")
    done.get(timeout=20)
    watched = cli("turn", "watch", done.id)
    assert watched.splitlines()[0].split()[1] == "turn.queued"
    assert "tool.started" in watched and watched.splitlines()[-1].split()[1] == "turn.succeeded"
    as_json = [orjson.loads(line) for line in cli("turn", "watch", done.id, "--json").splitlines()]
    assert as_json[-1]["type"] == "turn.succeeded" and as_json[-1]["turnId"] == done.id
    rest = cli("turn", "watch", done.id, "--after", as_json[1]["id"], "--json").splitlines()
    assert [orjson.loads(line)["id"] for line in rest] == [e["id"] for e in as_json[2:]]
    # A queued turn behind a slow one, cancelled from the command line: watch exits 4
    slow = run_turn.delay(agent="demo", conversation_id="c-cli2", message="slow think:3")
    queued = run_turn.delay(agent="demo", conversation_id="c-cli2", message="behind")
    assert "cancelled turn" in cli("turn", "cancel", queued.id, "--reason", "no longer needed")
    assert "already ended" in cli("turn", "cancel", queued.id)
    watch = CliRunner().invoke(main, ["turn", "watch", queued.id], catch_exceptions=False)
    assert watch.exit_code == 4, watch.output
    assert watch.stdout.splitlines()[-1].split()[1] == "turn.cancelled"
    assert "no longer needed" in cli("turn", "show", queued.id)
    assert "no turn" in cli("turn", "cancel", "nope", exit_code=1)
    assert "no turn" in cli("turn", "watch", "nope", exit_code=1)
    slow.get(timeout=20)


def test_celery_revoke_cancels_the_turn_and_a_restart_does_not_run_it(make_jobs: Any) -> None:
    jobs = make_jobs()
    worker = jobs.worker()
    jobs.pump()
    # Given a turn queued behind a running one
    running = run_turn.delay(agent="demo", conversation_id="c-rv", message="busy think:2")
    queued = run_turn.delay(agent="demo", conversation_id="c-rv", message="revoked one")
    wait_until(lambda: state_of(running.id) is TurnState.RUNNING, 10, "the first turn")
    # When it is revoked as Flower's button does
    app.control.revoke(queued.id)
    # Then it is cancelled: result.get() raises, the conversation goes on
    with pytest.raises(TurnCancelled):
        queued.get(timeout=10)
    running.get(timeout=20)
    # And after a worker restart it still does not run
    worker.stop()
    jobs.worker(name="w2")
    after = run_turn.delay(agent="demo", conversation_id="c-rv", message="after")
    assert after.get(timeout=20)["turnNumber"] == 2
    assert state_of(queued.id) is TurnState.CANCELLED
    stored = load_conversation("c-rv")
    assert stored is not None
    users = [m["content"] for m in stored.history if m["role"] == "user"]
    assert users == ["busy think:2", "after"]


def test_a_worker_with_a_bad_setting_refuses_to_start_in_one_line(make_jobs: Any) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    jobs = make_jobs()
    for variable, value in (("AGENTJOBS_LEASE_TTL_S", "soon"), ("AGENTJOBS_AGENTS", "nameless")):
        env = {**jobs.env, variable: value}
        command = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "threads"]
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert lines == [lines[0]] and lines[0].startswith(f"agentjobs: {variable}"), lines
