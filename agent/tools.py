"""Tools: `Tool`, the `@tool` decorator (JSON schema from type hints) and `ToolContext`."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, overload

import orjson

from agent.journal import ToolEffect, tool_effect
from agent.jsnumbers import js_json
from agent.timeouts import check_timeout_s


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the run calling it.

    `identity` is set only when the caller named one; a derived identity is never shown.
    `idempotency_key` is the same for one tool call however many times it is started (after a
    crash, a redelivery, a takeover) and different for every other call: pass it to payment and
    other APIs that accept one. `attempt` is 1 on the call's first start, higher on later ones.
    """

    run_id: str
    tool_call_id: str
    turn_number: int
    identity: Mapping[str, Any] | None = None
    clock: Mapping[str, Any] | None = None
    idempotency_key: str = ""
    attempt: int = 1


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: Mapping[str, Any]
    execute: Callable[..., Any]
    # Whether execute takes (args, ctx) rather than (args); worked out once, not per call.
    takes_context: bool = field(default=False)
    # Seconds a call may take before the run stops waiting for it; None: the agent's default
    # (Agent(tool_timeout_s=...)), and with none there either, no limit. Keyword-only, so
    # that it is never taken for takes_context.
    timeout_s: float | None = field(default=None, kw_only=True)
    # What running it again does (agent/journal.py): whether a call interrupted by a crash may
    # run again with the same idempotency key.
    effect: ToolEffect | str = field(default=ToolEffect.IDEMPOTENT, kw_only=True)
    # Whether a call needs a person's yes first (agent/pauses.py): True, or a callable
    # (args, ctx) -> bool, which asks when it raises.
    approval: bool | Callable[[Mapping[str, Any], ToolContext], bool] = field(
        default=False, kw_only=True
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Tool.name must be a non-empty string")
        if not callable(self.execute):
            raise TypeError(f"Tool {self.name!r}: execute must be callable")
        timeout_s = check_timeout_s(self.timeout_s, f"Tool {self.name!r}: timeout_s")
        object.__setattr__(self, "timeout_s", timeout_s)
        object.__setattr__(self, "effect", tool_effect(self.effect, f"Tool {self.name!r}: effect"))
        check_approval(self.approval, f"Tool {self.name!r}: approval")
        if not self.takes_context:
            object.__setattr__(self, "takes_context", _positional_arity(self.execute) >= 2)

    def spec(self) -> dict[str, Any]:
        """The tool as a model request lists it: {name, description, inputSchema}."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": dict(self.input_schema),
        }

    def call(self, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        if self.takes_context:
            return self.execute(dict(args), ctx)
        return self.execute(dict(args))


def check_approval(value: object, where: str) -> None:
    if not isinstance(value, bool) and not callable(value):
        raise TypeError(f"{where} must be True, False or a callable (args, ctx) -> bool")


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


# What the reference writes for a tool that returned nothing: not "", so the model can tell
# "no value" from "the empty answer".
NO_TOOL_VALUE = "(this tool returned no value)"


def unknown_tool_text(name: str) -> str:
    """The tool result for a call to a tool this agent does not have (p03)."""
    return f"Unknown tool: {name}"


def tool_result_text(value: Any) -> str:
    """A tool's return value as the tool message content, as the reference writes it: a str as
    is, None as NO_TOOL_VALUE, anything else as compact JSON with JavaScript's numbers (2.0 as
    2, -0.0 as 0, 1e21 as 1e+21)."""
    if isinstance(value, str):
        return value
    if value is None:
        return NO_TOOL_VALUE
    try:
        text = orjson.dumps(js_json(value), default=str, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, RecursionError) as exc:  # orjson.JSONEncodeError is a TypeError
        # A cyclic or otherwise unwritable value: say so, as the reference does, not crash.
        return f"[unstringifiable: {exc}]"
    return text.decode()


# ---------------------------------------------------------------------------------------------
# @tool: JSON schema from type hints

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(hint: Any) -> dict[str, Any]:
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _schema_for(inner[0])
        return {"anyOf": [_schema_for(a) for a in inner]}
    if hint in (list, tuple) or origin in (list, tuple, typing.Sequence):
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _schema_for(args[0])
        return schema
    if hint is dict or origin in (dict, typing.Mapping):
        return {"type": "object"}
    return {}


def _is_context(hint: Any) -> bool:
    return hint is ToolContext or (isinstance(hint, str) and hint.endswith("ToolContext"))


def _is_optional(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def tool_from_function(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    effect: ToolEffect | str = ToolEffect.IDEMPOTENT,
    approval: bool | Callable[[Mapping[str, Any], ToolContext], bool] = False,
) -> Tool:
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_param: str | None = None
    takes_any = False  # a **kwargs parameter
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if _is_context(hint):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            takes_any = takes_any or param.kind is param.VAR_KEYWORD
            continue
        properties[param.name] = _schema_for(hint)
        if param.default is param.empty and not _is_optional(hint):
            required.append(param.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    doc = inspect.getdoc(fn) or ""

    def execute(args: dict[str, Any], ctx: ToolContext) -> Any:
        # The reference does not check args against the schema (p06). A function without
        # **kwargs cannot take an undeclared keyword, so it does not see one (as a JavaScript
        # function ignores properties it does not read); with **kwargs it gets them all.
        if takes_any:
            given = {key: value for key, value in args.items() if key != context_param}
        else:
            given = {key: value for key, value in args.items() if key in properties}
        missing = [key for key in required if key not in given]
        if missing:
            raise TypeError(f"missing required arguments {missing}")
        if context_param is not None:
            return fn(**given, **{context_param: ctx})
        return fn(**given)

    return Tool(
        name=name or fn.__name__,
        description=description if description is not None else doc,
        input_schema=schema,
        execute=execute,
        takes_context=True,
        timeout_s=timeout_s,
        effect=effect,
        approval=approval,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    effect: ToolEffect | str = ToolEffect.IDEMPOTENT,
    approval: bool | Callable[[Mapping[str, Any], ToolContext], bool] = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    effect: ToolEffect | str = ToolEffect.IDEMPOTENT,
    approval: bool | Callable[[Mapping[str, Any], ToolContext], bool] = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a Tool of a function: `@tool` or `@tool(name=..., description=..., timeout_s=...,
    effect=..., approval=...)`.

    The name is the function's, the description its docstring, the input schema its type
    hints; a parameter annotated `ToolContext` receives the context and is not in the schema.
    """
    if fn is not None:
        return tool_from_function(fn)
    # Checked here too, so the error names the decorator's parameter.
    check_timeout_s(timeout_s, "@tool(timeout_s=...)")
    tool_effect(effect, "@tool(effect=...)")
    check_approval(approval, "@tool(approval=...)")

    def wrap(inner: Callable[..., Any]) -> Tool:
        return tool_from_function(
            inner,
            name=name,
            description=description,
            timeout_s=timeout_s,
            effect=effect,
            approval=approval,
        )

    return wrap
