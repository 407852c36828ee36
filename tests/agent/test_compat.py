"""The reference runtime's own files (agentfootprint 9.62): they load as they are, and replaying
each scenario here sends the same model requests and writes the same checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from agent import AgentRunCheckpoint, LLMResponse, ProviderHTTPError, RunCheckpointError, ToolCall
from tests.agent.support import (
    IDENTITY,
    ORDER_ANSWER,
    answer,
    charge_card_that_times_out,
    lookup_call,
    lookup_order,
    support_agent,
    without_volatile,
)
from tests.conftest import COMPAT_DIR, load_compat

CHECKPOINT_FILES = sorted(p.name for p in COMPAT_DIR.glob("*.checkpoint.json"))


def http_503() -> ProviderHTTPError:
    return ProviderHTTPError("Service Unavailable: upstream overloaded (HTTP 503)", status=503)


def request_dicts(provider: Any) -> list[dict[str, Any]]:
    return [orjson.loads(orjson.dumps(r.to_dict())) for r in provider.requests]


def test_all_fixture_kinds_are_present(compat_dir: Path) -> None:
    assert len(CHECKPOINT_FILES) == 16
    assert (compat_dir / "b0_llm_503_first_call.error.json").exists()


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_reference_checkpoint_round_trips_exactly(compat_dir: Path, name: str) -> None:
    raw = (compat_dir / name).read_bytes()
    checkpoint = AgentRunCheckpoint.from_json(raw)
    assert checkpoint.to_dict() == orjson.loads(raw)
    assert AgentRunCheckpoint.from_dict(orjson.loads(raw)).to_dict() == orjson.loads(raw)
    # Key order is the reference's too, so the compact bytes match a compact dump of the file.
    assert checkpoint.to_json() == orjson.dumps(orjson.loads(raw))


def test_b0_checkpoint_after_failure_loads() -> None:
    recorded = load_compat("b0_llm_503_first_call.error.json")
    assert isinstance(recorded, dict)
    cp = AgentRunCheckpoint.from_dict(recorded["checkpointAfterFailure"])
    assert cp.to_dict() == recorded["checkpointAfterFailure"]


def test_a1_single_turn() -> None:
    agent, provider = support_agent([answer("Hello! How can I help you today?")])
    result = agent.run({"message": "Hi there", "identity": IDENTITY})
    assert result.content == "Hello! How can I help you today?"
    assert request_dicts(provider) == load_compat("a1_single_turn.requests.json")
    expected = without_volatile(load_compat("a1_single_turn.checkpoint.json"))  # type: ignore[arg-type]
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    assert without_volatile(checkpoint.to_dict()) == expected
    assert result.checkpoint.to_dict() == checkpoint.to_dict() | {
        "checkpointedAt": result.checkpoint.checkpointed_at
    }


def test_a2_tool_round_keeps_assistant_text_next_to_the_call() -> None:
    agent, provider = support_agent([lookup_call("Let me check that order."), answer(ORDER_ANSWER)])
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert request_dicts(provider) == load_compat("a2_single_turn_with_tool.requests.json")
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    assert without_volatile(checkpoint.to_dict()) == without_volatile(
        load_compat("a2_single_turn_with_tool.checkpoint.json")  # type: ignore[arg-type]
    )


def test_a3_no_id_no_identity_writes_neither_key() -> None:
    agent, _ = support_agent([answer("Hello!")], named=False)
    agent.run("Hi there")
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    wire = checkpoint.to_dict()
    assert "agent" not in wire and "identity" not in wire
    assert without_volatile(wire) == without_volatile(
        load_compat("a3_single_turn_no_id_no_identity.checkpoint.json")  # type: ignore[arg-type]
    )


def test_b_llm_503_after_a_tool_round_then_resume_on_a_fresh_agent() -> None:
    agent, provider = support_agent([lookup_call(), http_503()])
    with pytest.raises(RunCheckpointError) as caught:
        agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    error = caught.value
    assert request_dicts(provider) == load_compat("b_llm_503.requests.json")
    assert without_volatile(error.checkpoint.to_dict()) == without_volatile(
        load_compat("b_llm_503.checkpoint.json")  # type: ignore[arg-type]
    )
    recorded_error = load_compat("b_llm_503.error.json")
    assert isinstance(recorded_error, dict)
    assert error.code == recorded_error["code"]
    assert str(error).startswith("[agent run] failed at iteration 2 during the LLM call")
    assert "(stage: call-llm)" in str(error)
    assert "captured at iteration 1" in str(error)
    assert str(error).endswith("Underlying error: " + recorded_error["cause"]["message"])
    assert error.cause.status == 503  # type: ignore[attr-defined]
    assert error.__cause__ is error.cause

    # Resume the reference's own checkpoint file on a fresh agent.
    fresh, fresh_provider = support_agent([answer(ORDER_ANSWER)])
    stored = AgentRunCheckpoint.from_json((COMPAT_DIR / "b_llm_503.checkpoint.json").read_bytes())
    result = fresh.resume_on_error(stored)
    assert request_dicts(fresh_provider)[0] == load_compat("b_llm_503.next_request.json")
    assert result.content == ORDER_ANSWER
    after = fresh.checkpoint()
    assert after is not None
    assert without_volatile(after.to_dict()) == without_volatile(
        load_compat("b_llm_503.after_resume.checkpoint.json")  # type: ignore[arg-type]
    )


def test_b0_first_call_failure_still_checkpoints_d1() -> None:
    agent, _ = support_agent([http_503()])
    with pytest.raises(RunCheckpointError) as caught:
        agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    crash = caught.value.checkpoint.to_dict()
    assert crash["history"] == [{"role": "user", "content": "Where is my order A-17?"}]
    assert crash["lastCompletedIteration"] == 0
    assert crash["failurePoint"] == {"iteration": 1, "phase": "llm", "stage": "call-llm"}
    # checkpoint() afterwards is what the reference's checkpoint() returned.
    recorded = load_compat("b0_llm_503_first_call.error.json")
    assert isinstance(recorded, dict)
    after = agent.checkpoint()
    assert after is not None
    assert without_volatile(after.to_dict()) == without_volatile(recorded["checkpointAfterFailure"])


def charge_call() -> LLMResponse:
    return LLMResponse(
        content="", tool_calls=[ToolCall(id="call_1", name="charge_card", args={"amount": 25})]
    )


def test_c1_tool_error_is_the_tool_result_and_the_loop_goes_on() -> None:
    charges: list[dict[str, Any]] = []
    agent, provider = support_agent(
        [charge_call(), answer("Sorry, the payment could not be processed.")],
        tools=(lookup_order, charge_card_that_times_out(charges)),
    )
    agent.run({"message": "Charge me $25", "identity": IDENTITY})
    assert charges == [{"amount": 25}]
    assert request_dicts(provider) == load_compat("c1_tool_throws_reported.requests.json")
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    assert without_volatile(checkpoint.to_dict()) == without_volatile(
        load_compat("c1_tool_throws_reported.checkpoint.json")  # type: ignore[arg-type]
    )


def test_c1_crash_after_the_tool_round_resumes_with_the_recorded_request() -> None:
    charges: list[dict[str, Any]] = []
    tools = (lookup_order, charge_card_that_times_out(charges))
    agent, _ = support_agent([charge_call(), http_503()], tools=tools)
    with pytest.raises(RunCheckpointError) as caught:
        agent.run({"message": "Charge me $25", "identity": IDENTITY})
    wire = caught.value.checkpoint.to_json()
    fresh, fresh_provider = support_agent(
        [answer("Sorry, the payment could not be processed.")], tools=tools
    )
    fresh.resume_on_error(AgentRunCheckpoint.from_json(wire))
    assert request_dicts(fresh_provider)[0] == load_compat(
        "c1_tool_throws_reported.next_request.json"
    )
    assert charges == [{"amount": 25}], "the completed round's tool must not run again"


def test_d_continue_from_on_a_fresh_agent_inherits_identity() -> None:
    turn1 = AgentRunCheckpoint.from_json((COMPAT_DIR / "d_turn1.checkpoint.json").read_bytes())
    agent, provider = support_agent([answer("You are welcome — anything else?")])
    result = agent.run(
        {"message": "Thanks! Can you also change the address?", "continueFrom": turn1}
    )
    assert request_dicts(provider)[0] == load_compat("d_continue_from.next_request.json")
    assert result.turn_number == 2
    after = agent.checkpoint()
    assert after is not None
    assert without_volatile(after.to_dict()) == without_volatile(
        load_compat("d_continue_from.checkpoint.json")  # type: ignore[arg-type]
    )


def test_d_follow_up_on_the_same_instance() -> None:
    agent, provider = support_agent([answer(ORDER_ANSWER), answer("Done.")])
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    agent.follow_up("Thanks!")
    assert request_dicts(provider)[1] == load_compat("d_followup.next_request.json")
    after = agent.checkpoint()
    assert after is not None
    assert without_volatile(after.to_dict()) == without_volatile(
        load_compat("d_followup.checkpoint.json")  # type: ignore[arg-type]
    )
