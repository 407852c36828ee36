"""Hard edge (PLATFORM.md 1): a broker message for our tasks whose body cannot be read as the
task's arguments at all is acknowledged, logged once and counted (`agentjobs_bad_messages_total`);
it never stops a consumer and changes no turn. Raw messages are published with kombu, past
run_turn.delay's checks, to real worker processes."""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from kombu import Connection, Exchange, Producer, Queue

from tasks import TurnDeadLettered, run_turn, turn_status
from tasks.queue.context import job_context
from tasks.testing import wait_until
from tasks.turn.worker import unreadable
from tests.tasks.test_metrics import scrape, start_metrics, value

# In every bad body: a Celery body dump in the log would show it.
MARKER = "BODY-MARKER-7731"
TURNS = "agentjobs.turns"
RETRY = "agentjobs.retry"
GOOD_KWARGS = {"agent": "demo", "conversation_id": "c-bad", "message": MARKER}


def publish(
    jobs: Any,
    body: Any,
    *,
    task: str = "tasks.run_turn",
    turn_id: Any = "bad-1",
    queue: str = TURNS,
    content_type: str = "application/json",
    raw: bool = False,
    headers: dict[str, Any] | None = None,
) -> None:
    """Publish one message as Celery's protocol 2 would, with `body` as its body (JSON-encoded
    unless `raw`) and `turn_id` as its id header (None: no id header)."""
    sent = {"lang": "py", "task": task, "argsrepr": "()", **(headers or {})}
    if turn_id is not None:
        sent["id"] = turn_id
    with Connection(jobs.env["REDIS_URL"]) as connection:
        target = Queue(queue, Exchange(queue), queue)
        Producer(connection).publish(
            body if raw else orjson.dumps(body),
            content_type=content_type,
            content_encoding="binary" if raw else "utf-8",
            headers=sent,
            routing_key=queue,
            exchange=target.exchange,
            declare=[target],
        )


def bad_messages() -> int:
    return int(job_context().redis.get(job_context().keys.bad_messages) or 0)


# (what is wrong, publish's keyword arguments)
RUN_TURN_CASES: list[tuple[str, dict[str, Any]]] = [
    ("a JSON string", {"body": f"not-a-tuple {MARKER}"}),
    ("a JSON number", {"body": 5}),
    ("JSON null", {"body": None}),
    ("not JSON", {"body": b"{not json " + MARKER.encode(), "raw": True}),
    ("two items", {"body": [[], GOOD_KWARGS]}),
    ("args not a list", {"body": [MARKER, GOOD_KWARGS, {}]}),
    ("kwargs not a dict", {"body": [[], [MARKER], {}]}),
    ("embed not a dict", {"body": [[], GOOD_KWARGS, MARKER]}),
    ("a dict without args", {"body": {"kwargs": GOOD_KWARGS, "note": MARKER}}),
    (
        "pickle",
        {
            "body": pickle.dumps(((), GOOD_KWARGS, {})),
            "raw": True,
            "content_type": "application/x-python-serialize",
        },
    ),
    ("raw data", {"body": MARKER.encode(), "raw": True, "content_type": "application/data"}),
    ("no id", {"body": [[], GOOD_KWARGS, {}], "turn_id": None}),
    ("an empty id", {"body": [[], GOOD_KWARGS, {}], "turn_id": ""}),
    ("an id with a control character", {"body": [[], GOOD_KWARGS, {}], "turn_id": "bad\x01id"}),
    ("an id of 201 characters", {"body": [[], GOOD_KWARGS, {}], "turn_id": "x" * 201}),
    ("an id that is a number", {"body": [[], GOOD_KWARGS, {}], "turn_id": 17}),
    ("a bad time limit", {"body": [[], GOOD_KWARGS, {}], "headers": {"timelimit": MARKER}}),
    ("a bad eta", {"body": [[], GOOD_KWARGS, {}], "headers": {"eta": MARKER}}),
]

RESUME_CASES: list[tuple[str, dict[str, Any]]] = [
    ("a turn id that is not a string", {"body": [[5, None], {}, {}]}),
    ("no turn id", {"body": [[], {"agent": MARKER}, {}]}),
    ("a namespace that is not a string", {"body": [["bad-r", 7], {}, {}]}),
    ("too many arguments", {"body": [["bad-r", None, "a", "c", MARKER], {}, {}]}),
    ("an unknown keyword", {"body": [["bad-r", None], {MARKER: 1}, {}]}),
    ("the turn id twice", {"body": [["bad-r"], {"turn_id": "bad-r"}, {}]}),
    ("a turn id of 300 characters", {"body": [["r" * 300, None], {}, {}]}),
    ("a JSON string", {"body": MARKER}),
]


def test_unreadable_messages_are_dropped_counted_and_logged_once_and_consumers_go_on(
    make_jobs: Any,
) -> None:
    jobs = make_jobs()
    worker = jobs.worker()
    cases = [("tasks.run_turn", TURNS, what, kw) for what, kw in RUN_TURN_CASES] + [
        ("tasks.resume_turn", RETRY, what, kw) for what, kw in RESUME_CASES
    ]
    # Given a worker and, in its queues, a message for each way a body can be unreadable
    for n, (task, queue, _, kw) in enumerate(cases):
        publish(jobs, task=task, queue=queue, **{"turn_id": f"bad-{n}", **kw})
    # When the worker has read them
    wait_until(lambda: bad_messages() >= len(cases), 30, f"{len(cases)} bad messages counted")
    time.sleep(0.5)  # anything that would follow them in the log
    # Then each was counted once and the worker is still alive and serves a turn
    assert bad_messages() == len(cases)
    assert worker.alive(), worker.log()[-3000:]
    reply = run_turn.delay(agent="demo", conversation_id="after", message="fine")
    assert reply.get(timeout=30)["content"] == "Done: fine"
    # and each is one WARNING line naming its task, with no body dump, no traceback and no
    # Celery error
    log = worker.log()
    dropped = [line for line in log.splitlines() if "dropped a tasks." in line]
    assert len(dropped) == len(cases), "\n".join(dropped)
    assert all("WARNING" in line for line in dropped)
    assert sum("tasks.resume_turn" in line for line in dropped) == len(RESUME_CASES)
    for bad in (MARKER, "Unrecoverable", "CRITICAL", "Traceback", "\x01"):
        assert bad not in log, log[-3000:]
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert all("is unavailable" in line for line in errors), errors  # the test's broken agents
    # and no turn was registered, run or dead-lettered for them
    for n in range(len(cases)):
        assert turn_status(f"bad-{n}") is None
    assert job_context().dead_letters.list_entries() == []
    # and the messages are gone: a new worker finds nothing to choke on
    worker.stop()
    again = jobs.worker(name="w2")
    time.sleep(1.5)
    assert again.alive() and bad_messages() == len(cases), again.log()[-3000:]


def test_a_turn_message_whose_arguments_parse_but_are_invalid_is_dead_lettered_as_before(
    make_jobs: Any,
) -> None:
    jobs = make_jobs()
    jobs.worker()
    # Given a well-formed message whose arguments are not a turn (args, an unknown key)
    publish(jobs, [[1], GOOD_KWARGS, {}], turn_id="with-args")
    publish(jobs, [[], {**GOOD_KWARGS, "colour": "red"}, {}], turn_id="with-colour")
    # Then both are dead-lettered as bad_payload, not dropped as unreadable
    for turn_id in ("with-args", "with-colour"):
        with pytest.raises(TurnDeadLettered) as caught:
            run_turn.AsyncResult(turn_id).get(timeout=30)
        assert caught.value.reason == "bad_payload"
    assert bad_messages() == 0


def test_agentjobs_metrics_exposes_the_bad_message_counter(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.worker()
    _, port = start_metrics(jobs)
    assert value(scrape(port), "agentjobs_bad_messages_total") == 0
    publish(jobs, "not-a-tuple")
    publish(jobs, [[5, None], {}, {}], task="tasks.resume_turn", queue=RETRY, turn_id="r-5")
    wait_until(lambda: bad_messages() == 2, 20, "two bad messages counted")
    assert value(scrape(port), "agentjobs_bad_messages_total") == 2


@dataclass
class _Message:
    """What unreadable() reads of a kombu message."""

    payload: Any
    headers: dict[str, Any] = field(default_factory=lambda: {"id": "t-1"})
    content_type: str = "application/x-orjson"


ACCEPTED = frozenset({"application/x-orjson", "application/json"})


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ("tasks.run_turn", _Message([[], GOOD_KWARGS, {"callbacks": None, "chord": None}])),
        ("tasks.run_turn", _Message([[], GOOD_KWARGS, None], content_type="application/json")),
        ("tasks.run_turn", _Message([[1], {"colour": "red"}, {}])),  # a bad_payload, later
        # Celery's protocol 1: everything in the body
        ("tasks.run_turn", _Message({"id": "t-1", "args": [], "kwargs": GOOD_KWARGS}, {})),
        ("tasks.resume_turn", _Message([["t-1", "acme/u/c"], {"agent": "a"}, {}])),
        ("tasks.resume_turn", _Message([[], {"turn_id": "t-1", "namespace": None}, {}])),
        ("tasks.resume_turn", _Message([["t-1", None, "a", "c"], {}, {}])),
    ],
)
def test_what_celery_and_our_clients_send_is_readable(task: str, message: _Message) -> None:
    assert unreadable(message, task, ACCEPTED) == ""


def test_an_unreadable_message_is_described_without_its_content() -> None:
    problem = unreadable(_Message([[], {MARKER: 1}, MARKER]), "tasks.run_turn", ACCEPTED)
    assert problem == "its embed is a string, not an object"
    problem = unreadable(
        _Message([[], {}, {}], content_type=f"text/{MARKER}\x00"), "tasks.run_turn", ACCEPTED
    )
    assert problem.startswith("its content type 'text/BODY-MARKER-7731?' is refused")
