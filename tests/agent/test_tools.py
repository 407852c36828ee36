"""Tools (docs/api.md, "Tools"): what a tool's return value becomes in history, what its
ToolContext holds,
and how @tool describes a function to the model."""

from __future__ import annotations

from typing import Any, Literal

import orjson
import pytest

from agent import Tool, ToolContext, tool
from tests.agent.support import (
    IDENTITY,
    answer,
    plain_agent,
    tool_call,
    wire_checkpoint,
    wire_of,
)


def returning(value: Any) -> Tool:
    return Tool(
        name="fetch",
        description="Return a fixed value.",
        input_schema={"type": "object", "properties": {}},
        execute=lambda args: value,
    )


def tool_result_of(tool_: Tool, **args: Any) -> str:
    agent, _ = plain_agent([tool_call("call_1", tool_.name, **args), answer("ok")], tools=[tool_])
    agent.run("go")
    (result,) = [m for m in wire_of(agent)["history"] if m["role"] == "tool"]
    assert result["toolCallId"] == "call_1" and result["toolName"] == tool_.name
    content: str = result["content"]
    return content


@pytest.mark.parametrize(
    ("value", "content"),
    [
        (
            {"orderId": "A-17", "items": [1, 2], "ok": True},
            '{"orderId":"A-17","items":[1,2],"ok":true}',
        ),
        ({"b": 1, "a": 2}, '{"b":1,"a":2}'),
        ([1, "two", None], '[1,"two",null]'),
        ({"price": 25.0, "rate": 0.5}, '{"price":25,"rate":0.5}'),
        ({"city": "Zürich", "emoji": "📦"}, '{"city":"Zürich","emoji":"📦"}'),
        (42, "42"),
        (None, "(this tool returned no value)"),
        (False, "false"),
        (True, "true"),
        ("plain text, as is", "plain text, as is"),
        ('{"already": "json"}', '{"already": "json"}'),
        ("", ""),
        (2.0, "2"),
        (-0.0, "0"),
        (12.5, "12.5"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (123456789012345680000.0, "123456789012345680000"),
        (0.1 + 0.2, "0.30000000000000004"),
        ([1.0, -0.0, [2.5]], "[1,0,[2.5]]"),
        ((1, "a"), '[1,"a"]'),
        ([], "[]"),
        ({}, "{}"),
        ({1: "one"}, '{"1":"one"}'),
        ({"nothing": None}, '{"nothing":null}'),
    ],
)
def test_a_return_value_becomes_the_tool_message_as_the_reference_writes_it(
    value: Any, content: str
) -> None:
    assert tool_result_of(returning(value)) == content


def test_a_tool_that_raises_reports_its_error_and_the_loop_goes_on() -> None:
    def broken(args: dict[str, Any]) -> str:
        raise RuntimeError("inventory service timeout")

    failing = Tool(name="fetch", description="", input_schema={}, execute=broken)
    agent, provider = plain_agent([tool_call("call_1", "fetch"), answer("Sorry.")], tools=[failing])
    assert agent.run("go").content == "Sorry."
    assert "inventory service timeout" in provider.requests[1].messages[-1]["content"]


def test_an_exception_with_an_empty_message_is_an_empty_result() -> None:
    def broken(args: dict[str, Any]) -> str:
        raise RuntimeError()

    failing = Tool(name="fetch", description="", input_schema={}, execute=broken)
    assert tool_result_of(failing) == ""


def test_a_value_json_cannot_hold_is_reported_not_a_crash() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert tool_result_of(returning(cyclic)).startswith("[unstringifiable: ")


def test_an_unknown_tool_is_reported_to_the_model_not_a_crash() -> None:
    agent, provider = plain_agent(
        [tool_call("call_1", "teleport"), answer("I cannot.")], tools=[returning("x")]
    )
    assert agent.run("go").content == "I cannot."
    reply = provider.requests[1].messages[-1]
    assert reply == {
        "role": "tool",
        "content": "Unknown tool: teleport",
        "toolCallId": "call_1",
        "toolName": "teleport",
    }


# ---------------------------------------------------------------------------------------------
# args: as the model sent them, never checked against the schema (p06)


def recording_tool(seen: list[dict[str, Any]]) -> Tool:
    def record(args: dict[str, Any]) -> str:
        seen.append(args)
        return "ok"

    return Tool(
        name="fetch",
        description="",
        input_schema={
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
        },
        execute=record,
    )


def test_a_tool_gets_every_arg_the_model_sent_schema_or_not() -> None:
    seen: list[dict[str, Any]] = []
    tool_result_of(recording_tool(seen), id="A-1", extra=True, nested={"deep": [1]})
    assert seen == [{"id": "A-1", "extra": True, "nested": {"deep": [1]}}]


def test_missing_and_mistyped_args_are_not_refused_either() -> None:
    seen: list[dict[str, Any]] = []
    tool_result_of(recording_tool(seen), id=17)
    tool_result_of(recording_tool(seen))
    assert seen == [{"id": 17}, {}]


def test_a_tool_gets_numbers_as_the_reference_holds_them() -> None:
    seen: list[dict[str, Any]] = []
    tool_result_of(recording_tool(seen), whole=2.0, zero=-0.0, small=1.5e-6, big=1e21)
    (args,) = seen
    assert args == {"whole": 2, "zero": 0, "small": 1.5e-6, "big": 1e21}
    assert [type(v) for v in args.values()] == [int, int, float, float]


def test_a_decorated_function_ignores_args_it_does_not_declare() -> None:
    assert tool_result_of(book_table, party=2, when="20:00", vip=True) == (
        '{"party":2,"when":"20:00","area":"inside"}'
    )


def test_a_decorated_function_with_kwargs_gets_the_undeclared_args() -> None:
    @tool
    def echo(orderId: str, **rest: Any) -> dict[str, Any]:
        """Echo the arguments back."""
        return {"orderId": orderId, **rest}

    assert echo.spec()["inputSchema"] == {
        "type": "object",
        "properties": {"orderId": {"type": "string"}},
        "required": ["orderId"],
    }
    assert tool_result_of(echo, orderId="A-17", verbose=True, depth=2) == (
        '{"orderId":"A-17","verbose":true,"depth":2}'
    )


def test_a_decorated_function_missing_a_required_arg_reports_it() -> None:
    assert tool_result_of(book_table, when="20:00") == "missing required arguments ['party']"


def test_a_model_arg_cannot_stand_in_for_the_context() -> None:
    seen: list[Any] = []

    @tool
    def whoami(ctx: ToolContext, **rest: Any) -> str:
        """Say who is asking."""
        seen.append((ctx, rest))
        return "ok"

    tool_result_of(whoami, ctx="forged", note="hi")
    ((ctx, rest),) = seen
    assert isinstance(ctx, ToolContext) and rest == {"note": "hi"}


def test_a_schema_is_sent_with_the_references_numbers() -> None:
    bounded = Tool(
        name="fetch",
        description="",
        input_schema={"type": "object", "properties": {"n": {"type": "number", "minimum": 0.0}}},
        execute=lambda args: "ok",
    )
    agent, provider = plain_agent([answer("ok")], tools=[bounded])
    agent.run("go")
    assert orjson.dumps(provider.requests[0].tools) == (
        b'[{"name":"fetch","description":"","inputSchema":{"type":"object",'
        b'"properties":{"n":{"type":"number","minimum":0}}}}]'
    )


# ---------------------------------------------------------------------------------------------
# ToolContext


class Spy:
    def __init__(self) -> None:
        self.seen: list[ToolContext] = []

    def tool(self) -> Tool:
        @tool
        def whoami(ctx: ToolContext) -> str:
            """Say who is asking."""
            self.seen.append(ctx)
            return "ok"

        return whoami


def test_the_context_carries_run_call_and_turn() -> None:
    spy = Spy()
    agent, _ = plain_agent(
        [tool_call("call_a", "whoami"), tool_call("call_b", "whoami"), answer("done")],
        tools=[spy.tool()],
    )
    result = agent.run({"message": "hello", "continueFrom": wire_checkpoint()})
    assert [ctx.tool_call_id for ctx in spy.seen] == ["call_a", "call_b"]
    assert {ctx.run_id for ctx in spy.seen} == {result.run_id}
    assert {ctx.turn_number for ctx in spy.seen} == {result.turn_number} == {2}


def test_the_context_identity_is_the_callers_only_when_named() -> None:
    spy = Spy()
    agent, _ = plain_agent(
        [tool_call("c1", "whoami"), answer("a"), tool_call("c2", "whoami"), answer("b")],
        tools=[spy.tool()],
    )
    agent.run("anonymous")
    agent.run({"message": "named", "identity": IDENTITY})
    assert spy.seen[0].identity is None
    assert dict(spy.seen[1].identity or {}) == IDENTITY


def test_execute_may_take_args_only_or_args_and_context() -> None:
    seen: list[Any] = []

    def two(args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((args, ctx.tool_call_id))
        return "two"

    def one(args: dict[str, Any]) -> str:
        seen.append(args)
        return "one"

    with_ctx = Tool(name="two", description="", input_schema={}, execute=two)
    args_only = Tool(name="one", description="", input_schema={}, execute=one)
    agent, _ = plain_agent(
        [tool_call("c1", "one", x=1), tool_call("c2", "two", y=2), answer("ok")],
        tools=[args_only, with_ctx],
    )
    agent.run("go")
    assert seen == [{"x": 1}, ({"y": 2}, "c2")]


# ---------------------------------------------------------------------------------------------
# @tool


@tool
def book_table(
    party: int, when: str, area: Literal["inside", "terrace"] = "inside"
) -> dict[str, Any]:
    """Book a table for a party."""
    return {"party": party, "when": when, "area": area}


def test_tool_takes_name_docstring_and_schema_from_the_function() -> None:
    agent, provider = plain_agent([answer("ok")], tools=[book_table])
    agent.run("hi")
    (spec,) = provider.requests[0].tools
    assert spec["name"] == "book_table"
    assert spec["description"] == "Book a table for a party."
    schema = spec["inputSchema"]
    assert schema["type"] == "object"
    assert schema["properties"]["party"] == {"type": "integer"}
    assert schema["properties"]["when"] == {"type": "string"}
    assert schema["properties"]["area"]["enum"] == ["inside", "terrace"]
    assert sorted(schema["required"]) == ["party", "when"]


def test_tool_is_called_with_the_models_args_as_keywords() -> None:
    assert tool_result_of(book_table, party=2, when="20:00") == (
        '{"party":2,"when":"20:00","area":"inside"}'
    )
