"""The identical-call note (p02): the second time within one run that a tool gives exactly the
same result for exactly the same args, the note is appended to that result, and only then."""

from __future__ import annotations

from typing import Any

import pytest

from agent import LLMResponse, Tool, ToolCall
from agent.repeated_calls import RepeatedCalls, identical_call_note
from tests.agent.support import (
    IDENTITY,
    answer,
    lookup_order,
    plain_agent,
    support_agent,
    tool_call,
    wire_of,
)
from tests.conftest import load_compat

NOTE = identical_call_note("lookup_order")
RESULT = '{"orderId":"A-17","status":"shipped","eta":"2026-09-01"}'


def tool_results(agent: Any) -> list[str]:
    return [m["content"] for m in wire_of(agent)["history"] if m["role"] == "tool"]


def test_the_note_is_the_reference_text() -> None:
    recorded = load_compat("p02_identical_call_note.checkpoint.json")
    assert isinstance(recorded, dict)
    assert recorded["history"][4]["content"] == RESULT + NOTE
    assert NOTE.startswith("\n\n[identical call: 'lookup_order' has now returned exactly")
    assert " 2 times this turn" in NOTE and "\u2014" in NOTE


# ---------------------------------------------------------------------------------------------
# the counter on its own


def test_only_the_second_identical_landing_gets_the_note() -> None:
    calls = RepeatedCalls()
    notes = [calls.note_for("lookup", {"q": "Q3"}, "rows") for _ in range(4)]
    assert notes == ["", identical_call_note("lookup"), "", ""]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("lookup", {"q": "Q3"}, "rows"), ("lookup", {"q": "Q4"}, "rows")),
        (("status", {"job": 1}, "running"), ("status", {"job": 1}, "done")),
        (("a", {"q": "Q3"}, "rows"), ("b", {"q": "Q3"}, "rows")),
        (("t", {"list": [1, 2]}, "r"), ("t", {"list": [2, 1]}, "r")),
    ],
    ids=["other-args", "other-result", "other-tool", "array-order"],
)
def test_a_different_call_or_result_is_not_a_repeat(
    first: tuple[str, dict[str, Any], str], second: tuple[str, dict[str, Any], str]
) -> None:
    calls = RepeatedCalls()
    assert calls.note_for(*first) == ""
    assert calls.note_for(*second) == ""


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"q": "Q3", "n": 1}, {"n": 1, "q": "Q3"}),
        ({"f": {"x": 1, "y": 2}}, {"f": {"y": 2, "x": 1}}),
    ],
    ids=["key-order", "nested-key-order"],
)
def test_key_order_does_not_matter(first: dict[str, Any], second: dict[str, Any]) -> None:
    calls = RepeatedCalls()
    calls.note_for("t", first, "r")
    assert calls.note_for("t", second, "r") == identical_call_note("t")


# ---------------------------------------------------------------------------------------------
# through the agent


def lookups(*order_ids: str) -> list[LLMResponse]:
    return [
        tool_call(f"call_{n}", "lookup_order", orderId=order_id)
        for n, order_id in enumerate(order_ids, start=1)
    ]


def test_a_third_identical_call_gets_no_note() -> None:
    agent, _ = support_agent([*lookups("A-17", "A-17", "A-17"), answer("Shipped.")])
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert tool_results(agent) == [RESULT, RESULT + NOTE, RESULT]


def test_the_count_restarts_with_the_next_turn() -> None:
    agent, _ = support_agent(
        [*lookups("A-17"), answer("Shipped."), *lookups("A-17"), answer("Still shipped.")]
    )
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    agent.follow_up("And now?")
    assert tool_results(agent) == [RESULT, RESULT]


def test_the_count_restarts_when_a_failed_turn_is_resumed() -> None:
    agent, _ = support_agent([*lookups("A-17"), answer("Shipped.")])
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    stored = agent.checkpoint()
    fresh, _ = support_agent([*lookups("A-17"), answer("Shipped.")])
    fresh.resume_on_error(stored)  # type: ignore[arg-type]
    assert tool_results(fresh) == [RESULT, RESULT], "a resume is a new run"


def test_two_identical_calls_in_one_reply_count_too() -> None:
    both = LLMResponse(
        content="",
        tool_calls=[
            ToolCall(id="call_a", name="lookup_order", args={"orderId": "A-17"}),
            ToolCall(id="call_b", name="lookup_order", args={"orderId": "A-17"}),
        ],
    )
    agent, _ = support_agent([both, answer("Shipped.")])
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert tool_results(agent) == [RESULT, RESULT + NOTE]


def test_args_in_another_key_order_and_number_spelling_are_the_same_call() -> None:
    seen: list[dict[str, Any]] = []

    def search(args: dict[str, Any]) -> str:
        seen.append(args)
        return "the same 40 rows"

    tool = Tool(name="search", description="", input_schema={}, execute=search)
    agent, _ = plain_agent(
        [
            tool_call("c1", "search", q="Q3", limit=2.0),
            LLMResponse(tool_calls=[ToolCall("c2", "search", {"limit": 2, "q": "Q3"})]),
            answer("done"),
        ],
        tools=[tool],
    )
    agent.run("go")
    assert len(seen) == 2, "the call still ran: a note, never a refusal"
    assert tool_results(agent) == [
        "the same 40 rows",
        "the same 40 rows" + identical_call_note("search"),
    ]


def test_a_repeated_error_gets_the_note() -> None:
    def broken(args: dict[str, Any]) -> str:
        raise RuntimeError("upstream 503")

    tool = Tool(name="broken", description="", input_schema={}, execute=broken)
    agent, _ = plain_agent(
        [tool_call("1", "broken"), tool_call("2", "broken"), answer("giving up")], tools=[tool]
    )
    agent.run("go")
    assert tool_results(agent) == ["upstream 503", "upstream 503" + identical_call_note("broken")]


def test_an_unknown_tool_called_twice_gets_no_note() -> None:
    # The tool did not run, so there is no result to call identical (the reference's rule).
    agent, _ = plain_agent(
        [tool_call("1", "nope"), tool_call("2", "nope"), answer("sorry")], tools=[lookup_order]
    )
    agent.run("go")
    assert tool_results(agent) == ["Unknown tool: nope", "Unknown tool: nope"]


def test_the_noted_result_is_what_the_model_reads_next() -> None:
    agent, provider = support_agent([*lookups("A-17", "A-17"), answer("Shipped.")])
    agent.run({"message": "Where is my order A-17?", "identity": IDENTITY})
    assert provider.requests[2].messages[-1]["content"] == RESULT + NOTE
