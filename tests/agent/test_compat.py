"""The reference runtime's own files (agentfootprint 9.62): they load as they are, and replaying
each scenario here sends the same model requests and writes the same checkpoints (p01-p07: byte
for byte, numbers included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from agent import (
    Agent,
    AgentResult,
    AgentRunCheckpoint,
    LLMResponse,
    ProviderHTTPError,
    RunCheckpointError,
    ScriptedProvider,
    Tool,
    ToolCall,
    tool,
)
from tests.agent.support import (
    IDENTITY,
    ORDER_ANSWER,
    answer,
    charge_card_that_times_out,
    exact_fixture,
    lookup_call,
    lookup_order,
    support_agent,
    tool_call,
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


# ---------------------------------------------------------------------------------------------
# p01-p07: the parity scenarios, compared as bytes (2 and 2.0 are equal dicts, not equal JSON)


def assert_replays(
    name: str, agent: Agent, provider: ScriptedProvider, result: AgentResult
) -> None:
    """Every request, the checkpoint (runId and checkpointedAt apart) and the answer are the
    reference's, byte for byte."""
    sent = orjson.dumps([request.to_dict() for request in provider.requests])
    assert sent == exact_fixture(f"{name}.requests.json")
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    written = orjson.dumps(without_volatile(checkpoint.wire()))
    assert written == exact_fixture(f"{name}.checkpoint.json", drop=("runId", "checkpointedAt"))
    assert {"output": result.content} == load_compat(f"{name}.output.json")
    assert without_volatile(result.checkpoint.wire()) == without_volatile(checkpoint.wire())
    # And what we wrote loads back to the same bytes.
    assert AgentRunCheckpoint.from_json(checkpoint.to_json()).to_json() == checkpoint.to_json()


def lookup(call_id: str, order_id: str) -> LLMResponse:
    return tool_call(call_id, "lookup_order", orderId=order_id)


def test_p01_the_action_budget_runs_out() -> None:
    calls = [lookup(f"call_{n}", f"A-{n}") for n in range(1, 7)]
    agent, provider = support_agent(
        [*calls, answer("Orders A-1 to A-5 have shipped; I did not get to A-6.")]
    )
    result = agent.run({"message": "Check orders A-1 to A-6.", "identity": IDENTITY})
    assert_replays("p01_max_iterations_wrap_up", agent, provider, result)
    assert result.stop_reason == "max_iterations" and result.iterations == 7


def test_p02_the_same_call_returns_the_same_result_twice() -> None:
    agent, provider = support_agent(
        [lookup("call_1", "A-17"), lookup("call_2", "A-17"), answer("A-17 has shipped.")]
    )
    result = agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert_replays("p02_identical_call_note", agent, provider, result)


def test_p03_the_model_calls_a_tool_that_is_not_registered() -> None:
    agent, provider = support_agent(
        [tool_call("call_x", "nope"), answer("Sorry, I cannot do that.")]
    )
    result = agent.run({"message": "Do the thing.", "identity": IDENTITY})
    assert_replays("p03_unknown_tool", agent, provider, result)


def test_p04_no_system_prompt_and_no_tools() -> None:
    provider = ScriptedProvider([answer("Hello! How can I help you today?")])
    agent = Agent(provider=provider, model="mock-model", id="support-agent", max_iterations=6)
    result = agent.run({"message": "Hi there", "identity": IDENTITY})
    assert_replays("p04_no_system_prompt", agent, provider, result)
    assert provider.requests[0].to_dict() == {
        "messages": [{"role": "user", "content": "Hi there"}],
        "model": "mock-model",
    }


MEASURE = Tool(
    name="measure",
    description="Echo the numbers back.",
    input_schema={
        "type": "object",
        "properties": {
            "qty": {"type": "number"},
            "big": {"type": "number"},
            "neg": {"type": "number"},
            "tiny": {"type": "number"},
        },
    },
    execute=lambda args: args,
)


def test_p05_whole_number_floats_in_args() -> None:
    call = tool_call("call_1", "measure", qty=2.0, big=1e21, neg=-0.0, tiny=1e-7)
    agent, provider = support_agent([call, answer("Measured.")], tools=(MEASURE,))
    result = agent.run({"message": "Measure it.", "identity": IDENTITY})
    assert_replays("p05_whole_number_floats_in_args", agent, provider, result)


def echo_args_tool() -> Tool:
    return Tool(
        name="echo_args",
        description="Echo the arguments back.",
        input_schema={
            "type": "object",
            "properties": {"orderId": {"type": "string"}},
            "required": ["orderId"],
        },
        execute=lambda args: args,
    )


P06_SCRIPT = [
    tool_call("call_1", "lookup_order", orderId="A-17", includeHistory=True),
    tool_call("call_2", "echo_args", orderId="A-17", verbose=True, depth=2),
    answer("Done."),
]


def test_p06_args_not_in_the_schema_reach_the_tool() -> None:
    agent, provider = support_agent(P06_SCRIPT, tools=(lookup_order, echo_args_tool()))
    result = agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert_replays("p06_args_not_in_schema", agent, provider, result)


def test_p06_with_echo_args_written_with_tool_and_kwargs() -> None:
    @tool(name="echo_args", description="Echo the arguments back.")
    def echo(orderId: str, **rest: Any) -> dict[str, Any]:
        return {"orderId": orderId, **rest}

    agent, provider = support_agent(P06_SCRIPT, tools=(lookup_order, echo))
    # @tool describes **rest as nothing, so the schema is the one the reference listed.
    result = agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert_replays("p06_args_not_in_schema", agent, provider, result)


@tool(description="Quote a price.")
def quote(item: str, qty: float | None = None) -> dict[str, Any]:
    return {"item": item, "qty": qty, "price": 12.5}


def test_p07_two_tool_calls_in_one_reply() -> None:
    both = LLMResponse(
        content="Checking both.",
        tool_calls=[
            ToolCall(id="call_a", name="lookup_order", args={"orderId": "A-17"}),
            ToolCall(id="call_b", name="quote", args={"item": "éclair", "qty": 3}),
        ],
    )
    agent, provider = support_agent(
        [both, answer("A-17 has shipped and 3 éclairs cost 12.5 each.")],
        tools=(lookup_order, quote),
    )
    result = agent.run(
        {"message": "Where is A-17, and what do 3 éclairs cost?", "identity": IDENTITY}
    )
    assert_replays("p07_two_tool_calls_one_response", agent, provider, result)
