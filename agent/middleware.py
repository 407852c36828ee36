"""The 'input' middleware chain (docs/checkpoint.md, "The input middleware chain"): run once
per run, before any model call.

A link is `link(message, ctx) -> None | str | Deny`. None lets the message through unchanged,
a str rewrites it, `Deny(reason)` denies the run. Anything else it returns, or an exception it
raises, also denies: a chain that cannot say yes clearly has said no.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import MessageDeniedError


@dataclass(frozen=True, slots=True)
class Deny:
    reason: str


@dataclass(frozen=True, slots=True)
class InputContext:
    """What a link sees: phase 'input', iteration 0, an empty history, the caller identity."""

    identity: Mapping[str, Any] | None
    phase: str = "input"
    iteration: int = 0
    history: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


InputMiddleware = Callable[[str, InputContext], "str | Deny | None"]


def _link_name(link: object, index: int) -> str:
    return getattr(link, "__name__", None) or f"link[{index}]"


def run_input_chain(
    chain: Sequence[InputMiddleware], message: str, identity: Mapping[str, Any] | None
) -> tuple[str, tuple[Mapping[str, Any], ...]]:
    """The message every link let through and one decision row per link, or MessageDeniedError
    carrying the message as it stood when a link refused it."""
    ctx = InputContext(identity=identity)
    decisions: list[Mapping[str, Any]] = []
    for index, link in enumerate(chain):
        name = _link_name(link, index)
        try:
            verdict = link(message, ctx)
        except Exception as exc:
            raise MessageDeniedError(f"{name} raised {type(exc).__name__}", message) from exc
        if verdict is None:
            decisions.append({"link": name, "decision": "allow"})
        elif isinstance(verdict, str):
            decisions.append(
                {"link": name, "decision": "rewrite", "before": message, "after": verdict}
            )
            message = verdict
        elif isinstance(verdict, Deny):
            raise MessageDeniedError(f"{name}: {verdict.reason}", message)
        else:
            raise MessageDeniedError(f"{name} returned {type(verdict).__name__}", message)
    return message, tuple(decisions)
