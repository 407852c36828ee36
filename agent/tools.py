"""Tools: `Tool`, the `@tool` decorator (JSON schema from type hints) and `ToolContext`."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, overload

import orjson


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the run calling it.

    `identity` is set only when the caller named one; a derived identity is never shown.
    """

    run_id: str
    tool_call_id: str
    turn_number: int
    identity: Mapping[str, Any] | None = None
    clock: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: Mapping[str, Any]
    execute: Callable[..., Any]
    # Whether execute takes (args, ctx) rather than (args); worked out once, not per call.
    takes_context: bool = field(default=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Tool.name must be a non-empty string")
        if not callable(self.execute):
            raise TypeError(f"Tool {self.name!r}: execute must be callable")
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


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def tool_result_text(value: Any) -> str:
    """A tool's return value as the tool message content: str as is, else compact JSON.

    Floats with an integral value print as integers, as JavaScript's JSON.stringify does.
    """
    if isinstance(value, str):
        return value
    return orjson.dumps(_js_numbers(value), default=str).decode()


def _js_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _js_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_js_numbers(v) for v in value]
    return value


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
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> Tool:
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if _is_context(hint):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        properties[param.name] = _schema_for(hint)
        if param.default is param.empty and not _is_optional(hint):
            required.append(param.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    doc = inspect.getdoc(fn) or ""

    def execute(args: dict[str, Any], ctx: ToolContext) -> Any:
        unknown = sorted(set(args) - set(properties))
        if unknown:
            raise TypeError(f"unexpected arguments {unknown}; expected {sorted(properties)}")
        missing = [key for key in required if key not in args]
        if missing:
            raise TypeError(f"missing required arguments {missing}")
        if context_param is not None:
            return fn(**args, **{context_param: ctx})
        return fn(**args)

    return Tool(
        name=name or fn.__name__,
        description=description if description is not None else doc,
        input_schema=schema,
        execute=execute,
        takes_context=True,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a Tool of a function: `@tool` or `@tool(name=..., description=...)`.

    The name is the function's, the description its docstring, the input schema its type
    hints; a parameter annotated `ToolContext` receives the context and is not in the schema.
    """
    if fn is not None:
        return tool_from_function(fn)

    def wrap(inner: Callable[..., Any]) -> Tool:
        return tool_from_function(inner, name=name, description=description)

    return wrap
