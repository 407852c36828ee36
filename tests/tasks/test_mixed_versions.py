"""Mixed versions in a rolling deploy: a conversation written by a newer worker carries keys this
runtime does not know. They survive a continuation, a resume after a failure and a dead-letter
replay, byte for byte."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from agent import AgentRunCheckpoint
from tasks import TurnDeadLettered, app, load_conversation, run_turn
from tasks.cli import main
from tasks.core.namespaces import namespace_for
from tasks.queue.context import job_context
from tasks.store.conversations import envelope_bytes

FUTURE_TOP = {"futurePlanner": {"steps": [1, 2, {"deep": "é\u2028"}], "v": 3.5}}
FUTURE_MESSAGE = {"futureAnnotations": [{"kind": "citation", "span": [0, 4]}]}


def newer_conversation() -> AgentRunCheckpoint:
    return AgentRunCheckpoint.from_dict(
        {
            "version": 1,
            "runId": "run-1796000000000-1",
            "history": [
                {"role": "user", "content": "Where is A-17?", **FUTURE_MESSAGE},
                {"role": "assistant", "content": "Shipped.", "futureTone": "warm"},
            ],
            "lastCompletedIteration": 1,
            "originalInput": {"message": "Where is A-17?"},
            "checkpointedAt": 1796000000000,
            "claimVerification": {"exact": 2, "reserved": [1]},
            "findingsLedger": [
                {"kind": "clock", "turn": 1, "now": "2026-11-30T09:00:00Z", "zone": "UTC"}
            ],
            **FUTURE_TOP,
        }
    )


def assert_carried(stored: AgentRunCheckpoint | None) -> None:
    assert stored is not None
    wire = orjson.loads(stored.to_json())
    for key, value in FUTURE_TOP.items():
        assert orjson.dumps(wire[key]) == orjson.dumps(value)
    assert orjson.dumps(wire["history"][0]["futureAnnotations"]) == orjson.dumps(
        FUTURE_MESSAGE["futureAnnotations"]
    )
    assert wire["history"][1]["futureTone"] == "warm"
    assert wire["claimVerification"] == {"exact": 2, "reserved": [1]}
    assert wire["findingsLedger"][0]["kind"] == "clock"


def seed(jobs: Any) -> None:
    jobs.redis.set(
        job_context().store.key(namespace_for("mixed", None)), envelope_bytes(newer_conversation())
    )


def test_unknown_keys_survive_a_continuation_and_a_resume(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.worker()
    jobs.pump()
    seed(jobs)
    run_turn.delay(agent="demo", conversation_id="mixed", message="and B-2?").get(timeout=30)
    assert_carried(load_conversation("mixed"))
    resumed = run_turn.delay(
        agent="demo", conversation_id="mixed", message="and C-3? rounds:1 fail:503x1"
    ).get(timeout=30)
    assert resumed["attempts"] == 2
    stored = load_conversation("mixed")
    assert_carried(stored)
    assert stored is not None and len(stored.history) == 2 + 2 + 4


def test_unknown_keys_survive_a_dead_letter_replay(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="1")
    jobs.worker()
    jobs.pump()
    seed(jobs)
    with pytest.raises(TurnDeadLettered) as caught:
        run_turn.delay(agent="demo", conversation_id="mixed", message="again fail:503x1").get(
            timeout=30
        )
    entry = job_context().dead_letters.get(caught.value.entry_id)
    assert entry is not None
    assert orjson.dumps(entry["checkpoint"]["futurePlanner"]) == orjson.dumps(
        FUTURE_TOP["futurePlanner"]
    )
    output = CliRunner().invoke(main, ["dlq", "replay", caught.value.entry_id]).output
    turn_id = output.split(" as turn ")[1].split(" ")[0]
    assert app.AsyncResult(turn_id).get(timeout=30)["content"] == "Done: again fail:503x1"
    assert_carried(load_conversation("mixed"))
