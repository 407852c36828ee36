"""Agents by name: celeryconfig AGENTS plus AGENTJOBS_AGENTS, each "module:factory"."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping

from agent import Agent
from tasks.errors import UnknownAgent


@functools.lru_cache(maxsize=256)
def _resolve(target: str) -> Callable[[], object]:
    module_name, _, attribute = target.partition(":")
    factory = importlib.import_module(module_name)
    for part in attribute.split("."):
        factory = getattr(factory, part)
    if not callable(factory):
        raise TypeError(f"{target} is not callable")
    return factory


def build_agent(name: str, agents: Mapping[str, str]) -> Agent:
    """A fresh Agent from the factory registered as `name` (one per turn: an Agent instance
    runs one turn at a time)."""
    target = agents.get(name)
    if target is None:
        raise UnknownAgent(name, sorted(agents))
    try:
        built = _resolve(target)()
    except Exception as exc:
        problem = f"agent {name!r} could not be built from {target}: {type(exc).__name__}: {exc}"
        raise UnknownAgent(name, sorted(agents), problem) from exc
    if not isinstance(built, Agent):
        problem = f"{target} returned {type(built).__name__}, not an agent.Agent"
        raise UnknownAgent(name, sorted(agents), problem)
    return built
