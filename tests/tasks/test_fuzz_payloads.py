"""Fuzzed run_turn payloads against a real worker: every one ends (succeeded or dead-lettered
with a reason), nothing but TurnDeadLettered reaches the caller, and the worker stays up."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks import TurnDeadLettered, app, run_turn
from tasks.core.errors import InvalidTurnRequest, Reason
from tasks.turn.tasks import check_request

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
plausible = {
    "agent": st.sampled_from(["demo", "nobody", "billing"]) | json_values,
    "conversation_id": st.text(min_size=1, max_size=12) | json_values,
    "message": st.text(min_size=1, max_size=40) | json_values,
    "identity": st.fixed_dictionaries(
        {}, optional={"tenant": st.text(max_size=6) | json_values, "principal": json_values}
    )
    | json_values,
    "message_from": st.sampled_from(["person", "composed", "robot"]) | json_values,
    "time": json_values,
}
payloads = st.fixed_dictionaries(
    {"agent": plausible["agent"], "conversation_id": plausible["conversation_id"]},
    optional={
        **{k: v for k, v in plausible.items() if k not in ("agent", "conversation_id")},
        "extra": json_values,
    },
).filter(lambda p: _encodable(p))


def _encodable(payload: dict[str, Any]) -> bool:
    try:
        orjson.dumps(payload)
    except TypeError:
        return False
    return True


REASONS = {r.value for r in Reason}


def test_fuzzed_payloads_end_cleanly_on_a_real_worker(jobs: Any) -> None:
    outcomes: list[str] = []

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
    )
    @given(payloads)
    def one(payload: dict[str, Any]) -> None:
        # Sent around run_turn.delay, whose submission check refuses what the worker would
        # dead-letter as bad_payload: the worker must handle whatever arrives.
        try:
            check_request((), payload, max_deadline_s=7 * 24 * 3600)
        except InvalidTurnRequest:
            refused = True
        else:
            refused = False
        result = app.send_task("tasks.run_turn", kwargs=payload)
        try:
            reply = result.get(timeout=20)
        except TurnDeadLettered as exc:
            assert exc.reason in REASONS
            assert exc.reason == "bad_payload" or not refused
            outcomes.append(exc.reason)
        else:
            assert not refused, "submission refused a payload the worker ran"
            assert isinstance(reply["content"], str)
            outcomes.append("succeeded")

    one()
    assert "bad_payload" in outcomes
    healthy = run_turn.delay(agent="demo", conversation_id="after-fuzz", message="ok")
    assert healthy.get(timeout=20)["content"] == "Done: ok"
    assert all(p.alive() for p in jobs.processes)
