"""What a worker's log says about a turn: that it ran, never what was said (Celery's own
success line used to carry each reply's content)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery.app import trace

from tasks import TurnDeadLettered, run_turn

PRIVATE = "PRIVATE-WORDS-4242"


def test_a_worker_log_does_not_carry_the_reply(make_jobs: Any) -> None:
    # Given a worker that keeps Celery's per-task lines
    jobs = make_jobs(AGENTJOBS_CELERY_TASK_LOGS="1")
    worker = jobs.worker()
    # and a turn whose reply holds private words
    reply = run_turn.delay(agent="demo", conversation_id="c-private", message=PRIVATE)
    assert PRIVATE in reply.get(timeout=30)["content"]
    # When the worker has logged the task's success
    worker.stop()
    log = worker.log()
    # Then the success line is there, without the reply or any part of it
    succeeded = [line for line in log.splitlines() if "succeeded in" in line]
    assert len(succeeded) == 1 and reply.id in succeeded[0], log[-3000:]
    assert PRIVATE not in log and "content" not in succeeded[0], succeeded[0]
    assert sum(f"[{reply.id}] received" in line for line in log.splitlines()) == 1


def test_by_default_a_worker_logs_no_line_per_task_but_its_warnings(make_jobs: Any) -> None:
    jobs = make_jobs()
    worker = jobs.worker()
    # Given two turns, one that succeeds and one that dead-letters
    ok = run_turn.delay(agent="demo", conversation_id="c-quiet", message="hi")
    bad = run_turn.delay(agent="broken", conversation_id="c-quiet-2", message="hi")
    ok.get(timeout=30)
    with pytest.raises(TurnDeadLettered):
        bad.get(timeout=30)
    worker.stop()
    log = worker.log()
    # Then Celery's received/succeeded lines are not in the log
    assert "received" not in log and "succeeded in" not in log, log[-3000:]
    # but the dead letter's warning is
    lines = log.splitlines()
    assert any(bad.id in line and "WARNING" in line and "dead-lettered" in line for line in lines)


def test_the_success_lines_data_carries_no_reply_or_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Custom log handlers (JSON formatters) may print a record's `data`: it loses them too.
    context = {"id": "t-1", "name": "tasks.run_turn", "runtime": 0.5}
    private = {"return_value": PRIVATE, "args": f"({PRIVATE!r},)", "kwargs": PRIVATE}
    with caplog.at_level(logging.INFO, logger="celery.app.trace"):
        trace.info(trace.LOG_SUCCESS, {**context, **private})
    (record,) = caplog.records
    assert record.getMessage() == "Task tasks.run_turn[t-1] succeeded in 0.5s"
    assert record.data == context  # type: ignore[attr-defined]


def test_a_worker_without_task_events_renders_no_turn_reply() -> None:
    # Celery's trace renders each return value for the success line (ours leaves it out) and
    # the task-succeeded event: without task events at the start, a turn's is never read.
    from types import SimpleNamespace

    from tasks.queue.app import app
    from tasks.turn.worker import GUARDED_TASKS, skip_result_repr

    tasks = [app.tasks[name] for name in GUARDED_TASKS]
    other = app.tasks["celery.backend_cleanup"]
    try:
        skip_result_repr(SimpleNamespace(task_events=True, app=app))
        assert [task.resultrepr_maxsize for task in tasks] == [1024, 1024]
        skip_result_repr(SimpleNamespace(task_events=False, app=app))
        assert [task.resultrepr_maxsize for task in tasks] == [0, 0]
        assert other.resultrepr_maxsize == 1024
    finally:
        for task in tasks:
            vars(task).pop("resultrepr_maxsize", None)
