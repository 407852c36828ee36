"""Agent: the doors (run, run(continue_from), follow_up, resume_on_error, checkpoint) and the
loop, against the door rules of docs/checkpoint.md and its Decisions D1-D10."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from agent import (
    Agent,
    AgentInput,
    AgentRunCheckpoint,
    CheckpointFormatError,
    Compaction,
    ConversationMismatchError,
    Deny,
    InvalidRunInputError,
    LLMRequest,
    LLMResponse,
    MessageDeniedError,
    NoConversationError,
    ProgressKind,
    ProgressReport,
    ProviderHTTPError,
    RunCheckpointError,
    RunInFlightError,
    ScriptedProvider,
    Tool,
    ToolAbort,
    ToolCall,
    ToolContext,
)
from agent.runtime import WRAP_UP_INSTRUCTION
from tests.agent.support import (
    IDENTITY,
    ORDER_ANSWER,
    RUN_ID_PATTERN,
    answer,
    drop,
    lookup_call,
    lookup_order,
    plain_agent,
    sent_messages,
    support_agent,
    system_prompts,
    tool_call,
    wire_checkpoint,
    wire_of,
)
from tests.conftest import COMPAT_DIR

OTHER_IDENTITY = {"tenant": "globex", "principal": "user-7", "conversationId": "conv-777"}
THIRD_IDENTITY = {"tenant": "initech", "principal": "user-9", "conversationId": "conv-999"}


def http_503() -> ProviderHTTPError:
    return ProviderHTTPError("Service Unavailable (HTTP 503)", status=503)


def crash_of(call: Callable[[], object]) -> RunCheckpointError:
    with pytest.raises(RunCheckpointError) as caught:
        call()
    return caught.value


def crash_wire(call: Callable[[], object]) -> dict[str, Any]:
    wire: dict[str, Any] = crash_of(call).checkpoint.to_dict()
    return wire


def without_stamp(wire: dict[str, Any]) -> dict[str, Any]:
    """checkpointedAt is when checkpoint() was called; everything else must stay put."""
    return {k: v for k, v in wire.items() if k != "checkpointedAt"}


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def tool_round_history() -> list[dict[str, Any]]:
    """A crash checkpoint's history: user, the assistant's call, the tool's result."""
    return [
        user("Where is my order A-17?"),
        {
            "role": "assistant",
            "content": "",
            "toolCalls": [{"id": "call_1", "name": "lookup_order", "args": {"orderId": "A-17"}}],
        },
        {
            "role": "tool",
            "content": '{"orderId":"A-17","status":"shipped","eta":"2026-09-01"}',
            "toolCallId": "call_1",
            "toolName": "lookup_order",
        },
    ]


def crash_checkpoint(**fields: Any) -> dict[str, Any]:
    return wire_checkpoint(
        history=tool_round_history(),
        failurePoint={"iteration": 2, "phase": "llm", "stage": "call-llm"},
        **fields,
    )


def endless_tool_calls(count: int) -> list[LLMResponse]:
    return [tool_call(f"call_{i}", "lookup_order", orderId=f"A-{i}") for i in range(1, count + 1)]


class ContextRecorder:
    """A tool that records the ToolContext of every call."""

    def __init__(self) -> None:
        self.contexts: list[ToolContext] = []
        self.tool = Tool(
            name="whoami",
            description="Record the context.",
            input_schema={"type": "object", "properties": {}},
            execute=self._execute,
        )

    def _execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.contexts.append(ctx)
        return "noted"


def recording_agent(
    steps: list[Any], **options: Any
) -> tuple[Agent, ScriptedProvider, ContextRecorder]:
    recorder = ContextRecorder()
    agent, provider = plain_agent(steps, tools=[recorder.tool], **options)
    return agent, provider, recorder


def whoami_then(text: str) -> list[LLMResponse]:
    return [tool_call("call_w", "whoami"), answer(text)]


# ---------------------------------------------------------------------------------------------
# a fresh run and checkpoint() ("The two writers")


def test_checkpoint_is_none_before_any_run() -> None:
    agent, _ = plain_agent([])
    assert agent.checkpoint() is None


def test_a_fresh_run_answers_and_checkpoint_appends_the_answer() -> None:
    agent, provider = plain_agent([answer("Hello!")])
    result = agent.run("Hi there")
    assert result.content == "Hello!"
    assert re.match(RUN_ID_PATTERN, result.run_id)
    assert result.turn_number == 1
    assert result.iterations == 1
    assert sent_messages(provider) == [user("Hi there")]
    wire = wire_of(agent)
    assert wire["history"] == [user("Hi there"), assistant("Hello!")]
    assert wire["runId"] == result.run_id
    assert wire["originalInput"] == {"message": "Hi there"}


def test_a_fresh_run_with_no_layers_writes_no_optional_key() -> None:
    agent, _ = plain_agent([answer("Hello!")])
    agent.run("Hi there")
    wire = wire_of(agent)
    assert set(wire) == {
        "version",
        "runId",
        "history",
        "lastCompletedIteration",
        "originalInput",
        "checkpointedAt",
    }
    assert wire["version"] == 1


def test_an_empty_answer_is_not_appended() -> None:
    agent, _ = plain_agent([answer("")])
    agent.run("Hi there")
    assert wire_of(agent)["history"] == [user("Hi there")]


def test_run_ids_are_minted_and_never_reused() -> None:
    agent, _ = plain_agent([answer("a"), answer("b"), answer("c")])
    first = agent.run("one")
    second = agent.follow_up("two")
    third = agent.run({"message": "three", "continueFrom": wire_checkpoint()})
    ids = [first.run_id, second.run_id, third.run_id, wire_checkpoint()["runId"]]
    assert len(set(ids)) == 4
    assert all(re.match(RUN_ID_PATTERN, run_id) for run_id in ids[:3])


def test_mutating_a_returned_checkpoint_does_not_touch_the_agent() -> None:
    agent, _ = plain_agent([answer("Hello!")])
    agent.run("Hi there")
    handed_out = wire_of(agent)
    handed_out["history"][0]["content"] = "tampered"
    handed_out["history"].append(user("injected"))
    assert wire_of(agent)["history"] == [user("Hi there"), assistant("Hello!")]


# ---------------------------------------------------------------------------------------------
# "What each door restores": what is carried and what starts fresh


@pytest.mark.parametrize(
    "as_given",
    [
        lambda wire: wire,
        lambda wire: AgentRunCheckpoint.from_dict(wire),
        lambda wire: orjson.dumps(wire),
        lambda wire: orjson.dumps(wire).decode(),
    ],
    ids=["dict", "checkpoint", "bytes", "str"],
)
@pytest.mark.parametrize("key", ["continueFrom", "continue_from", "AgentInput"])
def test_continue_from_restores_history_and_appends_the_new_user_turn(
    as_given: Callable[[dict[str, Any]], Any], key: str
) -> None:
    stored = wire_checkpoint()
    agent, provider = plain_agent([answer("You're welcome.")])
    given = as_given(stored)
    if key == "AgentInput":
        request: Any = AgentInput(message="Thanks!", continue_from=given)
    else:
        request = {"message": "Thanks!", key: given}
    result = agent.run(request)
    assert sent_messages(provider) == [*stored["history"], user("Thanks!")]
    wire = wire_of(agent)
    assert wire["history"] == [*stored["history"], user("Thanks!"), assistant("You're welcome.")]
    assert wire["originalInput"] == {"message": "Thanks!"}
    assert result.run_id != stored["runId"] and wire["runId"] == result.run_id


def test_resume_on_error_restores_history_and_appends_nothing() -> None:
    stored = crash_checkpoint()
    agent, provider = plain_agent([answer(ORDER_ANSWER)])
    result = agent.resume_on_error(stored)
    assert sent_messages(provider) == stored["history"]
    wire = wire_of(agent)
    assert wire["history"] == [*stored["history"], assistant(ORDER_ANSWER)]
    assert wire["originalInput"] == stored["originalInput"]
    assert result.run_id != stored["runId"] and re.match(RUN_ID_PATTERN, result.run_id)
    assert "failurePoint" not in wire


def budget_then_wrap_up(calls: int) -> list[LLMResponse]:
    """A model that never stops calling tools, then the wrap-up call's answer (p01)."""
    return [*endless_tool_calls(calls), answer("Here is what I found.")]


@pytest.mark.parametrize("door", ["continue", "resume"])
def test_both_doors_give_the_full_iteration_budget_again(door: str) -> None:
    stored = crash_checkpoint(lastCompletedIteration=9)
    agent, provider = plain_agent(budget_then_wrap_up(3), tools=[lookup_order], max_iterations=3)
    if door == "continue":
        result = agent.run({"message": "And order A-18?", "continueFrom": stored})
    else:
        result = agent.resume_on_error(stored)
    # Three calls within the budget (two rounds ran), then the wrap-up call without tools.
    assert len(provider.requests) == 4
    assert [bool(r.tools) for r in provider.requests] == [True, True, True, False]
    assert result.iterations == 4
    assert result.content == "Here is what I found."


@pytest.mark.parametrize("built", [0, -3, 2.5, "4", None])
def test_a_max_iterations_below_one_or_not_an_integer_becomes_one(built: Any) -> None:
    agent, provider = plain_agent(
        budget_then_wrap_up(5), tools=[lookup_order], max_iterations=built
    )
    agent.run("Where is my order?")
    # One call, whose tool call is not run, then the wrap-up call.
    assert len(provider.requests) == 2
    assert provider.requests[1].tools == []


def test_the_default_iteration_budget_is_ten() -> None:
    provider = ScriptedProvider(budget_then_wrap_up(12))
    agent = Agent(provider=provider, model="mock-model", tools=[lookup_order])
    result = agent.run("Where is my order?")
    assert len(provider.requests) == 11
    assert result.iterations == 11 and result.stop_reason == "max_iterations"


# ---------------------------------------------------------------------------------------------
# the action budget (p01): what happens when max_iterations runs out mid-task


class OrderLookups:
    """lookup_order that records which orders it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.tool = Tool(
            name="lookup_order",
            description="Look up an order by id.",
            input_schema={"type": "object", "properties": {"orderId": {"type": "string"}}},
            execute=self.lookup,
        )

    def lookup(self, args: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(args["orderId"])
        return {"orderId": args["orderId"], "status": "shipped"}


def tool_messages(wire: dict[str, Any]) -> list[str]:
    return [m["toolCallId"] for m in wire["history"] if m["role"] == "tool"]


def test_the_budget_message_is_the_reference_text() -> None:
    recorded = orjson.loads(
        (COMPAT_DIR / "p01_max_iterations_wrap_up.checkpoint.json").read_bytes()
    )
    assert recorded["history"][11] == user(WRAP_UP_INSTRUCTION)


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_the_last_allowed_tool_call_is_not_run_and_one_more_call_goes_out_without_tools(
    budget: int,
) -> None:
    orders = OrderLookups()
    agent, provider = plain_agent(
        [*endless_tool_calls(budget), answer("A-1 done; the rest not checked.")],
        tools=[orders.tool],
        max_iterations=budget,
    )
    result = agent.run("Check my orders.")
    # Rounds 1..budget-1 ran; the budget-th call did not.
    assert orders.asked == [f"A-{n}" for n in range(1, budget)]
    assert len(provider.requests) == budget + 1
    assert [bool(r.tools) for r in provider.requests] == [True] * budget + [False]
    assert "tools" not in provider.requests[-1].to_dict()
    wire = wire_of(agent)
    rounds = wire["history"][1:-2]
    assert len(rounds) == 2 * (budget - 1)
    assert wire["history"][-2:] == [
        user(WRAP_UP_INSTRUCTION),
        assistant("A-1 done; the rest not checked."),
    ]
    assert sent_messages(provider, budget) == wire["history"][:-1]
    assert f"call_{budget}" not in orjson.dumps(wire).decode(), "the unrun call is not kept"
    assert wire["lastCompletedIteration"] == budget + 1 == result.iterations
    assert result.content == "A-1 done; the rest not checked."
    assert result.stop_reason == "max_iterations"


def test_text_beside_the_last_allowed_tool_calls_is_not_kept() -> None:
    fragment = LLMResponse(
        content="A-1 has shipped. Let me check A-2 now:",
        tool_calls=[ToolCall(id="call_2", name="lookup_order", args={"orderId": "A-2"})],
    )
    orders = OrderLookups()
    agent, provider = plain_agent(
        [tool_call("call_1", "lookup_order", orderId="A-1"), fragment, answer("A-1 has shipped.")],
        tools=[orders.tool],
        max_iterations=2,
    )
    result = agent.run("Check A-1 and A-2.")
    assert orders.asked == ["A-1"]
    assert result.content == "A-1 has shipped."
    wire = wire_of(agent)
    assert "Let me check A-2" not in orjson.dumps(wire).decode()
    assert "Let me check A-2" not in orjson.dumps(provider.requests[-1].to_dict()).decode()
    assert wire["history"][-2] == user(WRAP_UP_INSTRUCTION)


def test_tool_calls_in_the_wrap_up_reply_are_not_run_either() -> None:
    orders = OrderLookups()
    stubborn = LLMResponse(
        content="Still checking.",
        tool_calls=[ToolCall(id="call_9", name="lookup_order", args={"orderId": "A-9"})],
    )
    agent, _ = plain_agent(
        [tool_call("call_1", "lookup_order", orderId="A-1"), stubborn],
        tools=[orders.tool],
        max_iterations=1,
    )
    result = agent.run("Check A-1.")
    assert orders.asked == [] and result.content == "Still checking."
    assert wire_of(agent)["history"] == [
        user("Check A-1."),
        user(WRAP_UP_INSTRUCTION),
        assistant("Still checking."),
    ]


def test_an_empty_wrap_up_answer_is_returned_and_not_appended() -> None:
    agent, _ = plain_agent(
        [*endless_tool_calls(1), answer("")], tools=[lookup_order], max_iterations=1
    )
    result = agent.run("Check A-1.")
    assert result.content == "" and result.stop_reason == "max_iterations"
    assert wire_of(agent)["history"] == [user("Check A-1."), user(WRAP_UP_INSTRUCTION)]


def test_an_answer_on_the_last_allowed_call_is_just_the_answer() -> None:
    agent, provider = plain_agent(
        [*endless_tool_calls(1), answer("Shipped.")], tools=[lookup_order], max_iterations=2
    )
    result = agent.run("Check A-1.")
    assert (result.content, result.stop_reason, result.iterations) == ("Shipped.", "answer", 2)
    assert len(provider.requests) == 2
    assert WRAP_UP_INSTRUCTION not in orjson.dumps(wire_of(agent)).decode()


def test_an_agent_without_tools_is_cut_short_with_the_last_reply_text() -> None:
    # Nothing to withhold, so no wrap-up call; before the budget ends such a call is unknown.
    agent, provider = plain_agent(
        [
            tool_call("call_1", "teleport"),
            LLMResponse(
                content="I would teleport.", tool_calls=[ToolCall("call_2", "teleport", {})]
            ),
        ],
        max_iterations=2,
    )
    result = agent.run("Go.")
    assert len(provider.requests) == 2
    assert (result.content, result.stop_reason) == ("I would teleport.", "max_iterations")
    history = wire_of(agent)["history"]
    assert history[2]["content"] == "Unknown tool: teleport"
    assert history[-1] == assistant("I would teleport.")
    assert WRAP_UP_INSTRUCTION not in orjson.dumps(history).decode()


def test_a_crash_in_the_wrap_up_call_checkpoints_the_budget_message() -> None:
    agent, _ = plain_agent(
        [*endless_tool_calls(2), http_503()], tools=[lookup_order], max_iterations=2
    )
    error = crash_of(lambda: agent.run("Check my orders."))
    checkpoint = error.checkpoint
    assert checkpoint.history[-1] == user(WRAP_UP_INSTRUCTION)
    assert tool_messages(checkpoint.to_dict()) == ["call_1"]
    assert checkpoint.last_completed_iteration == 2
    assert checkpoint.failure_point == {"iteration": 3, "phase": "llm", "stage": "call-llm"}
    # Resuming re-sends that history, with the tools and a full budget again.
    fresh, provider = plain_agent([answer("A-1 has shipped.")], tools=[lookup_order])
    assert fresh.resume_on_error(checkpoint.to_json()).content == "A-1 has shipped."
    assert sent_messages(provider) == checkpoint.history
    assert provider.requests[0].tools


def test_the_next_turn_after_a_wrap_up_offers_the_tools_again() -> None:
    agent, provider = plain_agent(
        [*endless_tool_calls(1), answer("Not checked."), answer("Hello again.")],
        tools=[lookup_order],
        max_iterations=1,
    )
    agent.run("Check A-1.")
    agent.follow_up("Thanks.")
    last = provider.requests[-1]
    assert last.tools and last.messages[-3:] == [
        user(WRAP_UP_INSTRUCTION),
        assistant("Not checked."),
        user("Thanks."),
    ]


# ---------------------------------------------------------------------------------------------
# "Turn numbers"


def history_with_users(count: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(1, count + 1):
        history += [user(f"question {n}"), assistant(f"answer {n}")]
    return history


def turn_seen_by_tool(result_turn: int, recorder: ContextRecorder) -> None:
    assert [ctx.turn_number for ctx in recorder.contexts] == [result_turn]


def test_a_fresh_run_is_turn_one() -> None:
    agent, _, recorder = recording_agent(whoami_then("ok"))
    result = agent.run("hello")
    assert result.turn_number == 1
    turn_seen_by_tool(1, recorder)


def test_continue_from_without_turn_number_is_the_user_count_plus_one() -> None:
    stored = wire_checkpoint(history=history_with_users(3))
    agent, _, recorder = recording_agent(whoami_then("ok"))
    result = agent.run({"message": "fourth", "continueFrom": stored})
    assert result.turn_number == 4
    turn_seen_by_tool(4, recorder)


def test_resume_without_turn_number_is_the_user_count() -> None:
    stored = wire_checkpoint(history=[*history_with_users(2), user("question 3")])
    agent, _, recorder = recording_agent(whoami_then("ok"))
    result = agent.resume_on_error(stored)
    assert result.turn_number == 3
    turn_seen_by_tool(3, recorder)


@pytest.mark.parametrize("history", [[], [assistant("hello, I am a bot")]])
def test_the_user_count_floor_is_at_least_one(history: list[dict[str, Any]]) -> None:
    agent, _ = plain_agent([answer("ok")])
    assert agent.resume_on_error(wire_checkpoint(history=history)).turn_number == 1


def test_a_stored_turn_number_drives_continue_from_as_stored_plus_one() -> None:
    stored = wire_checkpoint(history=history_with_users(2), turnNumber=7)
    agent, _, recorder = recording_agent(whoami_then("ok"), honesty={"inputs": True})
    result = agent.run({"message": "next", "continueFrom": stored})
    assert result.turn_number == 8
    turn_seen_by_tool(8, recorder)
    assert wire_of(agent)["turnNumber"] == 8


def test_a_stored_turn_number_drives_resume_as_the_same_turn() -> None:
    stored = wire_checkpoint(history=history_with_users(2), turnNumber=7)
    agent, _, recorder = recording_agent(whoami_then("ok"), honesty={"inputs": True})
    result = agent.resume_on_error(stored)
    assert result.turn_number == 7
    turn_seen_by_tool(7, recorder)
    assert wire_of(agent)["turnNumber"] == 7


def test_a_stored_turn_number_replaces_the_user_count_floor() -> None:
    # GUESS ("Turn numbers"), the decision the runtime takes: the stored number wins even when the
    # history (trimmed or rebuilt elsewhere) holds more user messages.
    stored = wire_checkpoint(history=history_with_users(5), turnNumber=2)
    agent, _ = plain_agent([answer("ok")])
    assert agent.run({"message": "next", "continueFrom": stored}).turn_number == 3


def test_turn_number_is_written_only_while_an_honesty_layer_is_armed() -> None:
    armed, _ = plain_agent([answer("a"), answer("b")], honesty={"inputs": True})
    armed.run("one")
    assert wire_of(armed)["turnNumber"] == 1
    armed.follow_up("two")
    assert wire_of(armed)["turnNumber"] == 2
    unarmed, _ = plain_agent([answer("a")])
    unarmed.run("one")
    assert "turnNumber" not in wire_of(unarmed)


def test_turn_numbers_climb_through_follow_ups_and_never_repeat() -> None:
    agent, _ = plain_agent([answer(str(n)) for n in range(4)], honesty={"inputs": True})
    turns = [agent.run("q0").turn_number] + [
        agent.follow_up(f"q{n}").turn_number for n in (1, 2, 3)
    ]
    assert turns == [1, 2, 3, 4]


def test_a_crash_keeps_the_turn_so_resume_reuses_it() -> None:
    agent, _ = plain_agent([answer("a"), http_503()], honesty={"inputs": True})
    agent.run("one")
    crash = crash_wire(lambda: agent.follow_up("two"))
    assert crash["turnNumber"] == 2
    fresh, _ = plain_agent([answer("b")], honesty={"inputs": True})
    assert fresh.resume_on_error(crash).turn_number == 2


def test_a_hop_through_an_old_worker_falls_back_to_the_user_count() -> None:
    # A 9.62 worker drops turnNumber; the reader must not reuse turn 1.
    agent, _ = plain_agent([answer("a"), answer("b")], honesty={"inputs": True})
    agent.run("one")
    hopped = {k: v for k, v in wire_of(agent).items() if k != "turnNumber"}
    assert agent.run({"message": "two", "continueFrom": hopped}).turn_number == 2


# ---------------------------------------------------------------------------------------------
# "Identity"


def identity_seen(recorder: ContextRecorder) -> list[Any]:
    return [None if ctx.identity is None else dict(ctx.identity) for ctx in recorder.contexts]


def test_a_plain_run_without_identity_stores_and_shows_none() -> None:
    progress: list[dict[str, Any]] = []
    agent, _, recorder = recording_agent(whoami_then("ok"))
    agent.run("hello", on_progress=lambda cp: progress.append(cp.to_dict()))
    assert identity_seen(recorder) == [None]
    assert "identity" not in wire_of(agent)
    assert progress and all("identity" not in cp for cp in progress)


@pytest.mark.parametrize("door", ["continue", "resume", "follow_up"])
def test_no_door_derives_an_identity_when_none_was_ever_given(door: str) -> None:
    agent, _, recorder = recording_agent([*whoami_then("a"), *whoami_then("b")])
    if door == "continue":
        agent.run({"message": "next", "continueFrom": wire_checkpoint()})
    elif door == "resume":
        agent.resume_on_error(crash_checkpoint())
    else:
        agent.run("one")
        agent.follow_up("two")
    assert set(identity_seen(recorder)) == {None}
    assert "identity" not in wire_of(agent)


def test_a_crash_without_identity_stores_none() -> None:
    agent, _ = plain_agent([http_503()])
    assert "identity" not in crash_wire(lambda: agent.run("hello"))


def test_plain_run_input_identity_beats_options_identity() -> None:
    agent, _, recorder = recording_agent(whoami_then("ok"))
    agent.run({"message": "hello", "identity": IDENTITY}, identity=OTHER_IDENTITY)
    assert identity_seen(recorder) == [IDENTITY]
    assert wire_of(agent)["identity"] == IDENTITY


def test_plain_run_options_identity_is_used_when_the_input_has_none() -> None:
    agent, _, recorder = recording_agent(whoami_then("ok"))
    agent.run("hello", identity=OTHER_IDENTITY)
    assert identity_seen(recorder) == [OTHER_IDENTITY]
    assert wire_of(agent)["identity"] == OTHER_IDENTITY


@pytest.mark.parametrize(
    ("input_identity", "options_identity", "expected"),
    [
        (THIRD_IDENTITY, OTHER_IDENTITY, THIRD_IDENTITY),
        (None, OTHER_IDENTITY, OTHER_IDENTITY),
        (None, None, IDENTITY),
    ],
    ids=["input-wins", "options-next", "stored-last"],
)
def test_continue_from_identity_priority(
    input_identity: Any, options_identity: Any, expected: dict[str, Any]
) -> None:
    stored = wire_checkpoint(identity=IDENTITY)
    agent, _, recorder = recording_agent(whoami_then("ok"))
    request: dict[str, Any] = {"message": "next", "continueFrom": stored}
    if input_identity is not None:
        request["identity"] = input_identity
    agent.run(request, identity=options_identity)
    assert identity_seen(recorder) == [expected]
    assert wire_of(agent)["identity"] == expected


@pytest.mark.parametrize(
    ("options_identity", "expected"),
    [(OTHER_IDENTITY, OTHER_IDENTITY), (None, IDENTITY)],
    ids=["options-wins", "stored-next"],
)
def test_resume_on_error_identity_priority(options_identity: Any, expected: dict[str, Any]) -> None:
    agent, _, recorder = recording_agent(whoami_then("ok"))
    agent.resume_on_error(crash_checkpoint(identity=IDENTITY), identity=options_identity)
    assert identity_seen(recorder) == [expected]
    assert wire_of(agent)["identity"] == expected


@pytest.mark.parametrize(
    ("options_identity", "expected"),
    [(OTHER_IDENTITY, OTHER_IDENTITY), (None, IDENTITY)],
    ids=["options-wins", "last-checkpoint-next"],
)
def test_follow_up_identity_priority(options_identity: Any, expected: dict[str, Any]) -> None:
    agent, _, recorder = recording_agent([*whoami_then("first"), *whoami_then("second")])
    agent.run({"message": "hello", "identity": IDENTITY})
    agent.follow_up("again", identity=options_identity)
    assert identity_seen(recorder) == [IDENTITY, expected]
    assert wire_of(agent)["identity"] == expected


def test_an_identity_inherited_from_a_checkpoint_is_stored_again() -> None:
    agent, _ = plain_agent([answer("a"), answer("b")])
    agent.run({"message": "next", "continueFrom": wire_checkpoint(identity=IDENTITY)})
    agent.follow_up("and again")
    assert wire_of(agent)["identity"] == IDENTITY


@pytest.mark.parametrize(
    "identity",
    ["conv-001", ["conv-001"], {"tenant": "acme"}, {"conversationId": 42}, {"conversationId": ""}],
)
def test_a_malformed_caller_identity_is_refused_before_the_run(identity: Any) -> None:
    agent, provider = plain_agent([answer("ok")])
    with pytest.raises(InvalidRunInputError) as caught:
        agent.run({"message": "hello", "identity": identity})
    assert caught.value.field.startswith("identity")
    assert provider.requests == [] and agent.checkpoint() is None


# ---------------------------------------------------------------------------------------------
# "Agent-id mismatch"


def billing_checkpoint() -> dict[str, Any]:
    return wire_checkpoint(agent={"id": "billing"})


@pytest.mark.parametrize("door", ["run", "resume_on_error"])
def test_edge_case_4_an_explicit_default_id_is_named_and_refused(door: str) -> None:
    agent, provider = plain_agent([answer("ok")], id="agent")
    with pytest.raises(ConversationMismatchError) as caught:
        if door == "run":
            agent.run({"message": "hi", "continueFrom": billing_checkpoint()})
        else:
            agent.resume_on_error(billing_checkpoint())
    error = caught.value
    assert error.code == "ERR_CONVERSATION_MISMATCH"
    assert error.stored_agent_id == "billing" and error.agent_id == "agent"
    assert str(error).startswith(f"[{door}]")
    assert provider.requests == [] and agent.checkpoint() is None


def test_edge_case_4_the_same_checkpoint_on_an_agent_without_id_is_accepted() -> None:
    agent, provider = plain_agent([answer("ok"), answer("ok")])
    agent.run({"message": "hi", "continueFrom": billing_checkpoint()})
    agent.resume_on_error(billing_checkpoint())
    assert len(provider.requests) == 2


def test_d10_an_unnamed_agent_continuing_a_named_conversation_writes_no_agent_key() -> None:
    agent, _ = plain_agent([answer("ok")])
    agent.run({"message": "hi", "continueFrom": billing_checkpoint()})
    assert "agent" not in wire_of(agent)


def test_a_named_agent_writes_its_id_even_when_it_is_the_default_value() -> None:
    agent, _ = plain_agent([answer("ok")], id="agent")
    agent.run("hi")
    assert wire_of(agent)["agent"] == {"id": "agent"}


def test_a_named_agent_accepts_its_own_and_unsigned_conversations() -> None:
    agent, provider = plain_agent([answer("a"), answer("b")], id="billing")
    agent.run({"message": "hi", "continueFrom": billing_checkpoint()})
    agent.run({"message": "hi", "continueFrom": wire_checkpoint()})
    assert len(provider.requests) == 2
    assert wire_of(agent)["agent"] == {"id": "billing"}


def test_changing_tools_prompt_or_model_is_never_a_mismatch() -> None:
    first, _ = support_agent([answer("a")])
    first.run("hi")
    provider = ScriptedProvider([answer("b")])
    changed = Agent(
        provider=provider, model="other-model", system="New prompt.", id="support-agent"
    )
    assert changed.run({"message": "again", "continueFrom": wire_of(first)}).content == "b"


# ---------------------------------------------------------------------------------------------
# "Crash checkpoints" / D1: RunCheckpointError and failurePoint


def test_edge_case_5_a_first_call_failure_of_a_fresh_run_checkpoints_d1() -> None:
    agent, _ = plain_agent([http_503()])
    error = crash_of(lambda: agent.run("Where is my order A-17?"))
    wire = error.checkpoint.to_dict()
    assert wire["history"] == [user("Where is my order A-17?")]
    assert wire["lastCompletedIteration"] == 0
    assert wire["failurePoint"] == {"iteration": 1, "phase": "llm", "stage": "call-llm"}
    assert isinstance(error.cause, ProviderHTTPError) and error.__cause__ is error.cause
    assert error.code == "ERR_RUN_CHECKPOINT"


def test_edge_case_5_a_first_call_failure_of_a_continuation_checkpoints_stored_plus_user() -> None:
    stored = wire_checkpoint()
    agent, _ = plain_agent([http_503()])
    wire = crash_wire(lambda: agent.run({"message": "Thanks!", "continueFrom": stored}))
    assert wire["history"] == [*stored["history"], user("Thanks!")]
    assert wire["lastCompletedIteration"] == 0
    assert wire["failurePoint"] == {"iteration": 1, "phase": "llm", "stage": "call-llm"}


def test_edge_case_5_a_first_call_failure_of_a_resume_checkpoints_the_stored_history() -> None:
    stored = crash_checkpoint()
    agent, _ = plain_agent([http_503()])
    wire = crash_wire(lambda: agent.resume_on_error(stored))
    assert wire["history"] == stored["history"]
    assert wire["lastCompletedIteration"] == 0
    assert wire["failurePoint"] == {"iteration": 1, "phase": "llm", "stage": "call-llm"}
    assert wire["originalInput"] == stored["originalInput"]


def test_edge_case_5_a_failure_after_one_tool_round() -> None:
    agent, _ = support_agent([lookup_call(), http_503()])
    error = crash_of(lambda: agent.run("Where is my order A-17?"))
    wire = error.checkpoint.to_dict()
    assert wire["history"] == tool_round_history()
    assert wire["lastCompletedIteration"] == 1
    assert wire["failurePoint"] == {"iteration": 2, "phase": "llm", "stage": "call-llm"}
    assert "failed at iteration 2" in str(error)
    assert "(stage: call-llm)" in str(error)
    assert str(error).endswith("Underlying error: Service Unavailable (HTTP 503)")


def test_a_d1_checkpoint_resumes_by_resending_its_history() -> None:
    agent, _ = plain_agent([http_503()])
    wire = crash_wire(lambda: agent.run("Where is my order A-17?"))
    fresh, provider = plain_agent([answer(ORDER_ANSWER)])
    fresh.resume_on_error(AgentRunCheckpoint.from_json(orjson.dumps(wire)))
    assert sent_messages(provider) == [user("Where is my order A-17?")]
    assert wire_of(fresh)["history"] == [user("Where is my order A-17?"), assistant(ORDER_ANSWER)]


def aborting_tool() -> Tool:
    def execute(args: dict[str, Any]) -> str:
        raise ToolAbort("card network refused the charge")

    return Tool(
        name="charge_card",
        description="Charge the card on file.",
        input_schema={"type": "object", "properties": {"amount": {"type": "number"}}},
        execute=execute,
    )


def test_a_tool_abort_fails_the_run_inside_the_tool_bracket() -> None:
    agent, _ = plain_agent(
        [lookup_call(), tool_call("call_2", "charge_card", amount=25)],
        tools=[lookup_order, aborting_tool()],
    )
    error = crash_of(lambda: agent.run("Where is my order A-17?"))
    wire = error.checkpoint.to_dict()
    assert wire["failurePoint"] == {"iteration": 2, "phase": "tool", "stage": "charge_card"}
    assert wire["history"] == tool_round_history(), "the aborted round is not in the checkpoint"
    assert wire["lastCompletedIteration"] == 1
    assert "during a tool call (stage: charge_card)" in str(error)
    assert isinstance(error.cause, ToolAbort)


@pytest.mark.parametrize(
    ("hook_error", "phase", "where"),
    [
        (RuntimeError("disk full"), "unknown", "unidentified point"),
        (RuntimeError("store refused iteration write"), "iteration", "between iterations"),
        (RuntimeError("Tool ledger unavailable"), "tool", "during a tool call"),
        (RuntimeError("provider quota store down"), "llm", "during the LLM call"),
    ],
)
def test_a_failure_with_no_bracket_open_is_classified_and_has_no_stage(
    hook_error: Exception, phase: str, where: str
) -> None:
    def hook(checkpoint: AgentRunCheckpoint) -> None:
        raise hook_error

    agent, provider = plain_agent([answer("never")])
    error = crash_of(lambda: agent.run("hello", on_progress=hook))
    assert error.cause is hook_error
    assert error.checkpoint.failure_point == {"iteration": 1, "phase": phase}
    assert error.checkpoint.history == [user("hello")]
    assert where in str(error) and "(stage:" not in str(error)
    assert provider.requests == [], "the run stops before the model is called"


def test_a_hook_failure_after_a_tool_round_checkpoints_that_round() -> None:
    calls: list[int] = []

    def hook(checkpoint: AgentRunCheckpoint) -> None:
        calls.append(len(checkpoint.history))
        if len(calls) == 2:
            raise OSError("redis went away")

    agent, provider = support_agent([lookup_call(), lookup_call(), answer("never")])
    error = crash_of(lambda: agent.run("Where is my order A-17?", on_progress=hook))
    assert error.checkpoint.history == tool_round_history()
    assert error.checkpoint.last_completed_iteration == 1
    assert "stage" not in (error.checkpoint.failure_point or {})
    assert len(provider.requests) == 1, "the next iteration did not start"


def test_failure_point_never_carries_urls_or_request_content() -> None:
    secret = "https://api.example.com/v1/chat?key=sk-live-123 body={'messages': 'secret'}"
    agent, _ = plain_agent([ProviderHTTPError(secret, status=503)])
    wire = crash_wire(lambda: agent.run("hello"))
    assert wire["failurePoint"] == {"iteration": 1, "phase": "llm", "stage": "call-llm"}
    assert b"sk-live-123" not in orjson.dumps(wire)


def test_the_crash_message_says_whether_to_resume() -> None:
    agent, _ = plain_agent([http_503()])
    assert "resume_on_error" in str(crash_of(lambda: agent.run("hello")))
    denied, _ = plain_agent([ProviderHTTPError("Unauthorized", status=401)])
    error = crash_of(lambda: denied.run("hello"))
    assert "Not resumable" in str(error)
    assert error.checkpoint.failure_point is not None, "still a post-mortem checkpoint"


def test_a_crash_checkpoint_holds_no_answer_and_stays_valid_json() -> None:
    agent, _ = support_agent([lookup_call("Checking."), http_503()])
    wire = crash_wire(lambda: agent.run("Where is my order A-17?"))
    assert AgentRunCheckpoint.from_json(orjson.dumps(wire)).to_dict() == wire
    assert wire["history"][-1]["role"] == "tool"


# ---------------------------------------------------------------------------------------------
# checkpoint() after a failure ("The two writers"; "Edge cases", item 8)


def test_edge_case_8_checkpoint_after_a_failed_run_has_no_stale_answer() -> None:
    agent, _ = plain_agent([answer("first answer"), http_503()])
    agent.run("first question")
    crash_of(lambda: agent.follow_up("second question"))
    history = wire_of(agent)["history"]
    assert history == [user("first question"), assistant("first answer"), user("second question")]
    assert wire_of(agent)["originalInput"] == {"message": "second question"}


def test_checkpoint_after_a_failed_tool_round_keeps_the_committed_rounds() -> None:
    agent, _ = support_agent([lookup_call(), http_503()])
    crash_of(lambda: agent.run("Where is my order A-17?"))
    wire = wire_of(agent)
    assert wire["history"] == tool_round_history()
    assert "failurePoint" not in wire


# ---------------------------------------------------------------------------------------------
# "Concurrency and refusals": RunInFlightError


class Gate:
    """A provider step that blocks inside the model call until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.run_id = ""

    def step(self, response: LLMResponse) -> Callable[[LLMRequest], LLMResponse]:
        def blocked(request: LLMRequest) -> LLMResponse:
            self.run_id = request.run_id
            self.entered.set()
            assert self.release.wait(10), "test gate never released"
            return response

        return blocked


def in_flight_error(call: Callable[[], object]) -> RunInFlightError:
    with pytest.raises(RunInFlightError) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("named", [False, True])
def test_a_second_run_on_the_same_instance_is_refused_while_one_is_in_flight(named: bool) -> None:
    gate = Gate()
    agent, provider = plain_agent(
        [gate.step(answer("first")), answer("second")], id="desk" if named else None
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(agent.run, "first question")
        assert gate.entered.wait(10)
        error = in_flight_error(lambda: agent.run("second question"))
        assert error.code == "ERR_RUN_IN_FLIGHT"
        assert error.agent_id == ("desk" if named else "agent")
        assert error.active_run_id == gate.run_id
        in_flight_error(lambda: agent.resume_on_error(crash_checkpoint()))
        gate.release.set()
        assert running.result(10).content == "first"
    assert len(provider.requests) == 1
    assert agent.run("second question").content == "second", "the mark is cleared afterwards"


def test_follow_up_is_refused_while_a_run_is_in_flight() -> None:
    gate = Gate()
    agent, _ = plain_agent([answer("first"), gate.step(answer("second")), answer("third")])
    agent.run("one")
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(agent.follow_up, "two")
        assert gate.entered.wait(10)
        in_flight_error(lambda: agent.follow_up("three"))
        gate.release.set()
        running.result(10)
    assert wire_of(agent)["history"][-2:] == [user("two"), assistant("second")]


def test_in_flight_is_checked_before_the_checkpoint_is_even_read() -> None:
    gate = Gate()
    agent, _ = plain_agent([gate.step(answer("first"))])
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(agent.run, "first question")
        assert gate.entered.wait(10)
        in_flight_error(lambda: agent.resume_on_error(b"not even json"))
        in_flight_error(lambda: agent.run({"message": "x", "continueFrom": {"version": 2}}))
        gate.release.set()
        running.result(10)


def test_many_instances_run_in_parallel_threads_without_cross_talk() -> None:
    count = 12
    barrier = threading.Barrier(count, timeout=10)

    def echo(request: LLMRequest) -> LLMResponse:
        barrier.wait()  # every instance is inside its model call at the same moment
        return answer(f"echo {request.messages[0]['content']}")

    def one_conversation(n: int) -> tuple[int, Any, dict[str, Any], list[Any]]:
        recorder = ContextRecorder()
        provider = ScriptedProvider([tool_call(f"call_{n}", "whoami"), echo])
        agent = Agent(provider=provider, model="mock-model", tools=[recorder.tool], id=f"a{n}")
        identity = {"tenant": f"t{n}", "conversationId": f"c{n}"}
        result = agent.run({"message": f"message {n}", "identity": identity})
        return n, result, wire_of(agent), [dict(ctx.identity or {}) for ctx in recorder.contexts]

    with ThreadPoolExecutor(max_workers=count) as pool:
        outcomes = list(pool.map(one_conversation, range(count)))
    for n, result, wire, identities in outcomes:
        assert result.content == f"echo message {n}"
        assert wire["history"][0] == user(f"message {n}")
        assert wire["identity"] == {"tenant": f"t{n}", "conversationId": f"c{n}"}
        assert wire["agent"] == {"id": f"a{n}"}
        assert identities == [{"tenant": f"t{n}", "conversationId": f"c{n}"}]
    assert len({result.run_id for _, result, _, _ in outcomes}) == count


def test_two_instances_may_continue_the_same_checkpoint_at_once() -> None:
    barrier = threading.Barrier(2, timeout=10)

    def meet(request: LLMRequest) -> LLMResponse:
        barrier.wait()
        return answer(f"re: {request.messages[-1]['content']}")

    stored = wire_checkpoint()
    agents = [plain_agent([meet])[0] for _ in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(a.run, {"message": f"branch {i}", "continueFrom": stored})
            for i, a in enumerate(agents)
        ]
        contents = [f.result(10).content for f in futures]
    assert contents == ["re: branch 0", "re: branch 1"]


# ---------------------------------------------------------------------------------------------
# "The follow_up door" / D3: follow_up and NoConversationError


def no_conversation(agent: Agent) -> NoConversationError:
    with pytest.raises(NoConversationError) as caught:
        agent.follow_up("anything else?")
    assert caught.value.code == "ERR_NO_CONVERSATION"
    return caught.value


def test_follow_up_on_an_agent_that_never_ran() -> None:
    agent, provider = plain_agent([answer("ok")])
    assert no_conversation(agent).reason == "never-run"
    assert provider.requests == []


def test_d3_follow_up_after_a_failed_run_is_refused() -> None:
    agent, provider = plain_agent([answer("a"), http_503(), answer("never")])
    agent.run("one")
    crash_of(lambda: agent.follow_up("two"))
    assert no_conversation(agent).reason == "last-run-unfinished"
    assert len(provider.requests) == 2


def test_d3_follow_up_after_a_first_run_that_failed_is_refused() -> None:
    agent, _ = plain_agent([http_503()])
    crash_of(lambda: agent.run("one"))
    assert no_conversation(agent).reason == "last-run-unfinished"


def test_d3_follow_up_after_a_denied_run_is_refused() -> None:
    agent, provider = plain_agent([answer("never")], input_middleware=[lambda m, c: Deny("no")])
    with pytest.raises(MessageDeniedError):
        agent.run("one")
    assert no_conversation(agent).reason == "last-run-unfinished"
    assert provider.requests == []


@pytest.mark.parametrize(
    "refused_call",
    [
        lambda agent: agent.run(""),
        lambda agent: agent.run({"message": "x", "continueFrom": {"version": 2}}),
        lambda agent: agent.resume_on_error(wire_checkpoint(agent={"id": "billing"})),
    ],
    ids=["bad-input", "bad-checkpoint", "mismatch"],
)
def test_a_refused_first_call_leaves_the_agent_never_run(refused_call: Any) -> None:
    agent, provider = plain_agent([answer("never")], id="desk")
    with pytest.raises((InvalidRunInputError, CheckpointFormatError, ConversationMismatchError)):
        refused_call(agent)
    assert agent.checkpoint() is None
    assert no_conversation(agent).reason == "never-run"
    assert provider.requests == []


def test_follow_up_after_a_successful_resume_continues() -> None:
    agent, provider = plain_agent([http_503(), answer("recovered"), answer("more")])
    error = crash_of(lambda: agent.run("one"))
    agent.resume_on_error(error.checkpoint)
    agent.follow_up("two")
    assert sent_messages(provider, 2) == [user("one"), assistant("recovered"), user("two")]


def test_follow_up_continues_the_last_checkpoint() -> None:
    agent, provider = plain_agent([answer("a"), answer("b")])
    agent.run("one")
    result = agent.follow_up("two")
    assert sent_messages(provider, 1) == [user("one"), assistant("a"), user("two")]
    assert result.turn_number == 2
    assert wire_of(agent)["originalInput"] == {"message": "two"}


# ---------------------------------------------------------------------------------------------
# "The run door": InvalidRunInputError


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (None, "input"),
        ([], "input"),
        (["hello"], "input"),
        (5, "input"),
        (b"hello", "input"),
        ("", "message"),
        ("   \n\t ", "message"),
        ({}, "message"),
        ({"message": None}, "message"),
        ({"message": 5}, "message"),
        ({"message": ["hi"]}, "message"),
        ({"message": "  "}, "message"),
        (AgentInput(message=""), "message"),
        (AgentInput(message=3), "message"),  # type: ignore[arg-type]
        ({"message": "hi", "messageFrom": "robot"}, "messageFrom"),
    ],
)
def test_invalid_run_input_is_refused_before_anything_happens(given: Any, field: str) -> None:
    agent, provider = plain_agent([answer("first"), answer("never")])
    agent.run("first question")
    before = without_stamp(wire_of(agent))
    with pytest.raises(InvalidRunInputError) as caught:
        agent.run(given)
    assert caught.value.code == "ERR_INVALID_RUN_INPUT"
    assert caught.value.field == field
    assert len(provider.requests) == 1
    assert without_stamp(wire_of(agent)) == before


@pytest.mark.parametrize(
    "message",
    ["a" * 1_000_001, "\U0001f600" * 500_001],
    ids=["1M+1-ascii", "500001-emoji"],
)
def test_a_message_over_one_million_utf16_units_is_refused(message: str) -> None:
    # The runtime's documented ceiling (MAX_MESSAGE_UTF16_UNITS), counted as JavaScript counts.
    agent, provider = plain_agent([answer("never")])
    with pytest.raises(InvalidRunInputError) as caught:
        agent.run(message)
    assert caught.value.field == "message"
    assert provider.requests == []


def test_extra_input_keys_pass_through() -> None:
    agent, _ = plain_agent([answer("ok")])
    assert agent.run({"message": "hello", "metadata": {"channel": "web"}}).content == "ok"


@pytest.mark.parametrize("message_from", ["person", "composed", None])
def test_message_from_is_accepted_and_never_written(message_from: str | None) -> None:
    agent, _ = plain_agent([answer("ok")])
    agent.run({"message": "hello", "messageFrom": message_from})
    wire = orjson.dumps(wire_of(agent))
    assert b"messageFrom" not in wire and b"composed" not in wire


def test_follow_up_with_a_bad_message_changes_nothing() -> None:
    agent, provider = plain_agent([answer("a"), answer("never")])
    agent.run("one")
    before = without_stamp(wire_of(agent))
    with pytest.raises(InvalidRunInputError):
        agent.follow_up("   ")
    assert without_stamp(wire_of(agent)) == before
    assert len(provider.requests) == 1


def test_a_message_json_cannot_carry_never_makes_an_unwritable_checkpoint() -> None:
    # A lone surrogate is a valid Python str but not UTF-8: refuse it at the door, or write it.
    agent, _ = plain_agent([answer("ok")])
    try:
        agent.run("half an emoji \ud83d")
    except InvalidRunInputError as refused:
        assert refused.field == "message"
        return
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    assert AgentRunCheckpoint.from_json(checkpoint.to_json()) == checkpoint


# ---------------------------------------------------------------------------------------------
# bad checkpoints at every door: a typed error naming the field, nothing half-applied

BAD_CHECKPOINTS: list[tuple[str, Any, str]] = [
    ("not-json", b"{'version': 1}", "<checkpoint>"),
    ("not-utf8", orjson.dumps(wire_checkpoint()).replace(b"Where", b"Wh\xffre"), "<checkpoint>"),
    ("str-not-json", "checkpoint please", "<checkpoint>"),
    ("number", 5, "<checkpoint>"),
    ("list", [wire_checkpoint()], "<checkpoint>"),
    ("version-2", wire_checkpoint(version=2), "version"),
    ("version-true", orjson.dumps(wire_checkpoint(version=True)), "version"),
    ("no-version", drop(wire_checkpoint(), "version"), "version"),
    ("no-run-id", drop(wire_checkpoint(), "runId"), "runId"),
    ("history-object", wire_checkpoint(history={}), "history"),
    ("no-original-input", wire_checkpoint(originalInput=None), "originalInput"),
    ("lci-string", wire_checkpoint(lastCompletedIteration="1"), "lastCompletedIteration"),
    ("skill-cursor-null", wire_checkpoint(skillCursor=None), "skillCursor"),
    ("turn-zero", wire_checkpoint(turnNumber=0), "turnNumber"),
    ("history-null", wire_checkpoint(history=[None]), "history[0]"),
    ("content-missing", wire_checkpoint(history=[{"role": "user"}]), "history[0]"),
    ("ledger-kind", wire_checkpoint(findingsLedger=[{"kind": "hunch"}]), "findingsLedger[0].kind"),
    (
        "huge-instruction",
        wire_checkpoint(
            evidenceRecovery={"revisionSpent": True, "pending": {"instruction": "x" * 1_000_001}}
        ),
        "evidenceRecovery.pending.instruction",
    ),
    ("huge-garbage", b"[" * 5_000_000, "<checkpoint>"),
]


@pytest.mark.parametrize(
    ("bad", "field"),
    [(bad, field) for _, bad, field in BAD_CHECKPOINTS],
    ids=[name for name, _, _ in BAD_CHECKPOINTS],
)
@pytest.mark.parametrize("door", ["continue_from", "resume_on_error"])
def test_a_bad_checkpoint_at_a_door_is_refused_and_nothing_is_half_applied(
    door: str, bad: Any, field: str
) -> None:
    agent, provider = plain_agent([answer("first"), answer("after")], id="support-agent")
    agent.run({"message": "first question", "identity": IDENTITY})
    before = without_stamp(wire_of(agent))
    with pytest.raises(CheckpointFormatError) as caught:
        if door == "continue_from":
            agent.run({"message": "next", "continueFrom": bad}, identity=OTHER_IDENTITY)
        else:
            agent.resume_on_error(bad, identity=OTHER_IDENTITY)
    assert caught.value.field == field
    assert len(provider.requests) == 1, "the provider is never called"
    assert without_stamp(wire_of(agent)) == before
    assert agent.follow_up("still here?").content == "after", "no stale state, no in-flight mark"


@pytest.mark.parametrize("door", ["run", "resume_on_error", "follow_up"])
def test_a_bad_option_at_a_door_changes_nothing(door: str) -> None:
    agent, provider = plain_agent([answer("first"), answer("after")])
    agent.run("first question")
    before = without_stamp(wire_of(agent))
    with pytest.raises(InvalidRunInputError):
        if door == "run":
            agent.run({"message": "x", "continueFrom": wire_checkpoint()}, identity={"x": 1})
        elif door == "resume_on_error":
            agent.resume_on_error(wire_checkpoint(), identity={"conversationId": 5})
        else:
            agent.follow_up("x", time={"zone": "Europe/Paris"})
    assert len(provider.requests) == 1
    assert without_stamp(wire_of(agent)) == before


# ---------------------------------------------------------------------------------------------
# "Edge cases", item 9


def test_edge_case_9_resume_with_an_empty_history_replays_the_original_message() -> None:
    stored = wire_checkpoint(history=[], originalInput={"message": "Where is my order A-17?"})
    agent, provider = plain_agent([answer(ORDER_ANSWER)])
    agent.resume_on_error(stored)
    assert sent_messages(provider) == [user("Where is my order A-17?")]
    assert wire_of(agent)["history"] == [user("Where is my order A-17?"), assistant(ORDER_ANSWER)]


# ---------------------------------------------------------------------------------------------
# "The input middleware chain"


def test_a_link_that_returns_none_lets_the_message_through() -> None:
    agent, provider = plain_agent([answer("ok")], input_middleware=[lambda m, c: None])
    result = agent.run("hello")
    assert sent_messages(provider) == [user("hello")]
    assert [row["decision"] for row in result.middleware_decisions] == ["allow"]


def redact(message: str, ctx: Any) -> str:
    return message.replace("4111-1111-1111-1111", "[card]")


def test_a_rewrite_is_the_user_entry_and_the_original_input() -> None:
    agent, provider = plain_agent([answer("ok")], input_middleware=[redact])
    result = agent.run("charge 4111-1111-1111-1111")
    assert sent_messages(provider) == [user("charge [card]")]
    wire = wire_of(agent)
    assert wire["history"][0] == user("charge [card]")
    assert wire["originalInput"] == {"message": "charge [card]"}
    (row,) = result.middleware_decisions
    assert row["before"] == "charge 4111-1111-1111-1111" and row["after"] == "charge [card]"


def test_edge_case_6_a_continuation_rewrite_and_the_raw_crash_text() -> None:
    stored = wire_checkpoint()
    agent, _ = plain_agent([answer("ok")], input_middleware=[redact])
    agent.run({"message": "pay with 4111-1111-1111-1111", "continueFrom": stored})
    assert wire_of(agent)["history"][-2] == user("pay with [card]")
    assert wire_of(agent)["originalInput"] == {"message": "pay with [card]"}

    crashing, _ = plain_agent([http_503()], input_middleware=[redact])
    crash = crash_of(
        lambda: crashing.run({"message": "pay with 4111-1111-1111-1111", "continueFrom": stored})
    )
    assert crash.checkpoint.history[-1] == user("pay with [card]")
    assert crash.checkpoint.original_input == {"message": "pay with 4111-1111-1111-1111"}
    assert wire_of(crashing)["originalInput"] == {"message": "pay with [card]"}


def test_links_run_in_order_each_seeing_the_last_rewrite() -> None:
    seen: list[str] = []

    def first(message: str, ctx: Any) -> str:
        seen.append(message)
        return message.upper()

    def second(message: str, ctx: Any) -> str:
        seen.append(message)
        return message + "!"

    agent, provider = plain_agent([answer("ok")], input_middleware=[first, second])
    agent.run("hello")
    assert seen == ["hello", "HELLO"]
    assert sent_messages(provider) == [user("HELLO!")]


@pytest.mark.parametrize("identity", [None, IDENTITY])
def test_a_link_sees_phase_iteration_history_and_only_a_given_identity(identity: Any) -> None:
    contexts: list[Any] = []
    agent, _ = plain_agent([answer("ok")], input_middleware=[lambda m, ctx: contexts.append(ctx)])
    agent.run({"message": "hello", "identity": identity})
    (ctx,) = contexts
    assert ctx.phase == "input" and ctx.iteration == 0 and list(ctx.history) == []
    assert (None if ctx.identity is None else dict(ctx.identity)) == identity


def test_resume_runs_the_chain_on_the_original_message() -> None:
    seen: list[str] = []
    agent, provider = plain_agent([answer("ok")], input_middleware=[lambda m, c: seen.append(m)])
    agent.resume_on_error(crash_checkpoint(originalInput={"message": "raw text"}))
    assert seen == ["raw text"]
    assert sent_messages(provider) == tool_round_history(), "nothing appended on resume"


def raising_link(message: str, ctx: Any) -> str:
    raise PermissionError("policy engine says no")


@pytest.mark.parametrize(
    "link",
    [
        lambda m, c: Deny("off-topic"),
        raising_link,
        lambda m, c: 5,
        lambda m, c: True,
        lambda m, c: {"message": m},
        lambda m, c: b"bytes",
    ],
    ids=["deny", "raise", "int", "bool", "dict", "bytes"],
)
@pytest.mark.parametrize("door", ["run", "continue", "resume"])
def test_a_denied_message_raises_message_denied_unwrapped(link: Any, door: str) -> None:
    agent, provider = plain_agent([answer("never")], input_middleware=[link])
    with pytest.raises(MessageDeniedError) as caught:
        if door == "run":
            agent.run("hello")
        elif door == "continue":
            agent.run({"message": "hello", "continueFrom": wire_checkpoint()})
        else:
            agent.resume_on_error(crash_checkpoint())
    assert not isinstance(caught.value, RunCheckpointError)
    assert caught.value.code == "ERR_MESSAGE_DENIED"
    assert provider.requests == []


def test_a_denial_after_an_allowing_link_still_denies() -> None:
    agent, provider = plain_agent(
        [answer("never")], input_middleware=[lambda m, c: None, lambda m, c: Deny("no")]
    )
    with pytest.raises(MessageDeniedError):
        agent.run("hello")
    assert provider.requests == []


# ---------------------------------------------------------------------------------------------
# the evidence-repair budget ("What each door restores")

CITE = "Revise: cite the tool result that supports each claim."


class EvidenceCheck:
    """Asks for a revision every time it is consulted; counts the consultations."""

    def __init__(self, instruction: str | None = CITE) -> None:
        self.instruction = instruction
        self.calls: list[str] = []

    def __call__(self, answer_text: str, history: Any) -> str | None:
        self.calls.append(answer_text)
        return self.instruction


def no_message_mentions(provider: ScriptedProvider, text: str) -> bool:
    return all(text not in m["content"] for r in provider.requests for m in r.messages)


def test_a_revision_is_asked_for_in_the_system_prompt_never_as_a_user_message() -> None:
    check = EvidenceCheck()
    agent, provider = plain_agent([answer("draft"), answer("revised")], evidence_check=check)
    result = agent.run("Where is my order A-17?")
    assert result.content == "revised"
    assert check.calls == ["draft"], "one revision per turn"
    first, second = system_prompts(provider)
    assert CITE not in first and CITE in second
    assert (
        sent_messages(provider, 1)
        == sent_messages(provider, 0)
        == [user("Where is my order A-17?")]
    )
    assert no_message_mentions(provider, CITE)
    wire = wire_of(agent)
    assert wire["history"] == [user("Where is my order A-17?"), assistant("revised")]
    assert wire["evidenceRecovery"] == {"revisionSpent": True}


def test_no_revision_writes_no_evidence_recovery() -> None:
    agent, _ = plain_agent([answer("fine")], evidence_check=EvidenceCheck(None))
    agent.run("hello")
    assert "evidenceRecovery" not in wire_of(agent)


def crash_while_revision_pending() -> dict[str, Any]:
    agent, _ = plain_agent([answer("draft"), http_503()], evidence_check=EvidenceCheck())
    return crash_wire(lambda: agent.run("Where is my order A-17?"))


def test_a_crash_while_the_revision_is_pending_checkpoints_the_instruction() -> None:
    wire = crash_while_revision_pending()
    assert wire["evidenceRecovery"] == {"revisionSpent": True, "pending": {"instruction": CITE}}
    assert wire["failurePoint"]["phase"] == "llm"
    assert all(CITE not in m["content"] for m in wire["history"])


def test_resume_re_serves_the_pending_instruction_on_iteration_one_only() -> None:
    stored = orjson.dumps(crash_while_revision_pending())
    check = EvidenceCheck()
    agent, provider = plain_agent(
        [lookup_call(), answer("revised")], tools=[lookup_order], evidence_check=check
    )
    result = agent.resume_on_error(stored)
    assert result.content == "revised"
    first, second = system_prompts(provider)
    assert CITE in first and CITE not in second
    assert no_message_mentions(provider, CITE)
    assert check.calls == [], "the restored budget is already spent: no second revision"
    assert wire_of(agent)["evidenceRecovery"] == {"revisionSpent": True}


def test_resume_with_a_spent_budget_and_nothing_pending_allows_no_revision() -> None:
    stored = crash_checkpoint(evidenceRecovery={"revisionSpent": True})
    check = EvidenceCheck()
    agent, provider = plain_agent([answer("final"), answer("never")], evidence_check=check)
    assert agent.resume_on_error(stored).content == "final"
    assert len(provider.requests) == 1
    assert CITE not in system_prompts(provider)[0]


def test_continue_from_starts_a_fresh_repair_budget() -> None:
    stored = crash_while_revision_pending()
    check = EvidenceCheck()
    agent, provider = plain_agent([answer("draft 2"), answer("revised 2")], evidence_check=check)
    result = agent.run({"message": "try again", "continueFrom": stored})
    assert CITE not in system_prompts(provider)[0], "the stored pending instruction is ignored"
    assert check.calls == ["draft 2"], "a fresh budget: one revision is allowed again"
    assert result.content == "revised 2"


def test_follow_up_starts_a_fresh_repair_budget() -> None:
    check = EvidenceCheck()
    agent, provider = plain_agent(
        [answer("d1"), answer("r1"), answer("d2"), answer("r2")], evidence_check=check
    )
    agent.run("one")
    assert agent.follow_up("two").content == "r2"
    assert check.calls == ["d1", "d2"]
    assert len(provider.requests) == 4


# ---------------------------------------------------------------------------------------------
# on_progress: persist-then-proceed


def test_on_progress_is_called_after_seeding_and_after_each_tool_round() -> None:
    events: list[str] = []
    seen: list[AgentRunCheckpoint] = []

    def order_tool(args: dict[str, Any]) -> str:
        events.append(f"tool {args['orderId']}")
        return "shipped"

    tool = Tool(
        name="lookup_order",
        description="Look up an order by id.",
        input_schema={"type": "object", "properties": {"orderId": {"type": "string"}}},
        execute=order_tool,
    )

    def hook(checkpoint: AgentRunCheckpoint) -> None:
        events.append(f"progress {checkpoint.last_completed_iteration}")
        seen.append(checkpoint)

    agent, _ = plain_agent(
        [
            tool_call("c1", "lookup_order", orderId="A-1"),
            tool_call("c2", "lookup_order", orderId="A-2"),
            answer("done"),
        ],
        tools=[tool],
    )
    result = agent.run("check both", on_progress=hook)
    assert events == ["progress 0", "tool A-1", "progress 1", "tool A-2", "progress 2"]
    assert [len(cp.history) for cp in seen] == [1, 3, 5], "the history as of each round"
    for checkpoint in seen:
        assert checkpoint.failure_point is None
        assert checkpoint.run_id == result.run_id
        assert checkpoint.original_input == {"message": "check both"}
        assert AgentRunCheckpoint.from_json(checkpoint.to_json()) == checkpoint
    assert seen[0].history == [user("check both")], "not changed by the rest of the run"


def test_a_plain_answer_reports_progress_once() -> None:
    seen: list[AgentRunCheckpoint] = []
    agent, _ = plain_agent([answer("hi")])
    agent.run("hello", on_progress=seen.append)
    assert [cp.history for cp in seen] == [[user("hello")]]


def test_a_progress_checkpoint_resumes_like_a_crash_checkpoint() -> None:
    seen: list[AgentRunCheckpoint] = []
    agent, _ = support_agent([lookup_call(), answer(ORDER_ANSWER)])
    agent.run("Where is my order A-17?", on_progress=seen.append)
    fresh, provider = support_agent([answer(ORDER_ANSWER)])
    fresh.resume_on_error(seen[-1].to_json())
    assert sent_messages(provider) == tool_round_history()


def test_follow_up_and_resume_report_progress_too() -> None:
    seen: list[AgentRunCheckpoint] = []
    agent, _ = plain_agent([answer("a"), answer("b"), answer("c")])
    agent.run("one")
    agent.follow_up("two", on_progress=seen.append)
    agent.resume_on_error(crash_checkpoint(), on_progress=seen.append)
    assert seen[0].history[-1] == user("two")
    assert seen[1].history == tool_round_history()


def test_on_report_names_what_moved_at_the_same_points_as_on_progress() -> None:
    reports: list[ProgressReport] = []
    checkpoints: list[AgentRunCheckpoint] = []
    agent, _ = support_agent(
        [lookup_call(), lookup_call(), answer(ORDER_ANSWER)],
    )
    agent.run(
        {"message": "Where is my order A-17?", "identity": IDENTITY},
        on_progress=checkpoints.append,
        on_report=reports.append,
    )
    assert [r.kind for r in reports] == [
        ProgressKind.SEEDED,
        ProgressKind.ROUND,
        ProgressKind.ROUND,
    ]
    assert [r.checkpoint for r in reports] == checkpoints, "the same checkpoints, in order"
    assert all(r.checkpoint is c for r, c in zip(reports, checkpoints, strict=True))
    assert [str(r.kind) for r in reports] == ["seeded", "round", "round"]


def test_on_report_alone_and_on_progress_alone_each_work() -> None:
    reports: list[ProgressReport] = []
    agent, _ = plain_agent([answer("hi"), answer("again")])
    agent.run("hello", on_report=reports.append)
    assert [(r.kind, r.checkpoint.history) for r in reports] == [
        (ProgressKind.SEEDED, [user("hello")])
    ]
    legacy: list[Any] = []
    agent.follow_up("and?", on_progress=lambda checkpoint: legacy.append(checkpoint))
    assert [type(c) for c in legacy] == [AgentRunCheckpoint]


def test_a_fold_and_a_wrap_up_are_reported_by_kind() -> None:
    reports: list[ProgressReport] = []
    compaction = Compaction(max_messages=3, keep_last=1)
    agent, _ = plain_agent(
        [*endless_tool_calls(2), answer("done")],
        tools=[lookup_order],
        max_iterations=2,
        compaction=compaction,
    )
    agent.run("Check my orders.", on_report=reports.append)
    # Seeded; round 1's tool result; the wrap-up ask; then the wrap-up call's fold.
    assert [r.kind for r in reports] == [
        ProgressKind.SEEDED,
        ProgressKind.ROUND,
        ProgressKind.ROUND,
        ProgressKind.FOLDED,
    ]
    assert reports[2].checkpoint.history[-1] == user(WRAP_UP_INSTRUCTION)
    assert reports[3].checkpoint.folded


def test_follow_up_and_resume_take_on_report_too() -> None:
    reports: list[ProgressReport] = []
    agent, _ = plain_agent([answer("a"), answer("b"), answer("c")])
    agent.run("one")
    agent.follow_up("two", on_report=reports.append)
    agent.resume_on_error(crash_checkpoint(), on_report=reports.append)
    assert [r.kind for r in reports] == [ProgressKind.SEEDED, ProgressKind.SEEDED]
    assert reports[1].checkpoint.history == tool_round_history()


def test_an_on_report_that_raises_stops_the_run_like_on_progress() -> None:
    def hook(report: ProgressReport) -> None:
        if report.kind is ProgressKind.ROUND:
            raise OSError("redis went away")

    agent, provider = support_agent([lookup_call(), lookup_call(), answer("never")])
    error = crash_of(lambda: agent.run("Where is my order A-17?", on_report=hook))
    assert isinstance(error.cause, OSError)
    assert error.checkpoint.history == tool_round_history()
    assert len(provider.requests) == 1, "the next iteration did not start"


def test_when_on_progress_raises_on_report_is_not_called_for_that_point() -> None:
    reports: list[ProgressReport] = []

    def failing(checkpoint: AgentRunCheckpoint) -> None:
        raise OSError("disk full")

    agent, _ = plain_agent([answer("never")])
    crash_of(lambda: agent.run("hello", on_progress=failing, on_report=reports.append))
    assert reports == []


def test_a_progress_report_is_a_frozen_value() -> None:
    agent, _ = plain_agent([answer("hi")])
    reports: list[ProgressReport] = []
    agent.run("hello", on_report=reports.append)
    with pytest.raises(AttributeError):
        reports[0].kind = ProgressKind.ROUND  # type: ignore[misc]
    assert ProgressKind("folded") is ProgressKind.FOLDED


# ---------------------------------------------------------------------------------------------
# D2 / D7 / D9: what every agent carries through every door


CARRIED = {
    "findingsLedger": [
        {
            "kind": "standing",
            "toolCallId": "call_1",
            "standing": "fact",
            "assertions": ["A-17 shipped"],
            "declaredOn": "answer",
            "iteration": 2,
            "turn": 1,
        },
        {"kind": "judgment", "turn": 1, "verdict": "later build"},
    ],
    "claimVerification": {"exact": {"call_1": 2}, "reservations": [1, 2, 3]},
    "futureThing": {"written": "by a newer worker"},
    "folded": [
        {
            "summaryFingerprint": "deadbeef",
            "runId": "run-1700000000000-1",
            "iteration": 1,
            "foldedAtMs": 1700000000000,
            "model": "ref-model",
            "messageCount": 2,
            "removedStageIds": ["s1"],
            "retained": "discard",
        }
    ],
}


def carried_of(wire: dict[str, Any]) -> dict[str, Any]:
    return {key: wire.get(key) for key in CARRIED}


@pytest.mark.parametrize("door", ["continue", "resume", "follow_up"])
def test_every_agent_carries_ledger_claims_folded_and_unknown_keys(door: str) -> None:
    # An agent with no findings, verification or compaction layer keeps them all
    # (D2, D7, "Folding").
    stored = crash_checkpoint(**CARRIED)
    agent, _ = plain_agent([answer("a"), answer("b")])
    if door == "continue":
        agent.run({"message": "next", "continueFrom": stored})
    elif door == "resume":
        agent.resume_on_error(stored)
    else:
        agent.run({"message": "next", "continueFrom": stored})
        agent.follow_up("and again")
    assert carried_of(wire_of(agent)) == CARRIED


@pytest.mark.parametrize("door", ["continue", "resume"])
def test_crash_and_progress_checkpoints_carry_them_too(door: str) -> None:
    stored = crash_checkpoint(**CARRIED)
    seen: list[AgentRunCheckpoint] = []
    agent, _ = plain_agent([http_503()])
    if door == "continue":
        crash = crash_wire(
            lambda: agent.run({"message": "n", "continueFrom": stored}, on_progress=seen.append)
        )
    else:
        crash = crash_wire(lambda: agent.resume_on_error(stored, on_progress=seen.append))
    assert carried_of(crash) == CARRIED
    assert carried_of(seen[0].to_dict()) == CARRIED


def test_unknown_message_keys_survive_and_reach_the_provider() -> None:
    history = [
        {"role": "user", "content": "hi", "attachments": [{"ref": "img-1"}]},
        {"role": "assistant", "content": "hello", "citations": [{"url": "u"}], "x-trace": 7},
    ]
    agent, provider = plain_agent([answer("ok")])
    agent.run({"message": "next", "continueFrom": wire_checkpoint(history=history)})
    assert sent_messages(provider)[:2] == history
    assert wire_of(agent)["history"][:2] == history


def test_injected_by_and_ephemeral_stay_in_the_record_not_the_request() -> None:
    injected = {
        "role": "user",
        "content": "Reminder: be brief.",
        "injectedBy": {"injectionId": "i1", "flavor": "instruction", "iteration": 1},
    }
    ephemeral = {"role": "user", "content": "scratch", "ephemeral": True}
    history = [user("hi"), injected, ephemeral]
    agent, provider = plain_agent([answer("ok")])
    agent.resume_on_error(wire_checkpoint(history=history))
    assert sent_messages(provider) == [user("hi"), user("Reminder: be brief.")]
    assert wire_of(agent)["history"][:3] == history
