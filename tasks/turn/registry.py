"""Agents by name: celeryconfig AGENTS plus AGENTJOBS_AGENTS, each "module:factory".

A factory's module imports from the worker's working directory, as the module of `celery -A`
does: `celery -A tasks worker` run in a project directory finds `myapp.agents` there without
PYTHONPATH.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent import Agent
from tasks.core.errors import AgentUnavailable, UnknownAgent
from tasks.core.redact import redact, tool_error_redactor


@functools.lru_cache(maxsize=256)
def _resolve(target: str) -> Callable[[], object]:
    module_name, _, attribute = target.partition(":")
    _import_from_working_directory()
    factory = importlib.import_module(module_name)
    for part in attribute.split("."):
        factory = getattr(factory, part)
    if not callable(factory):
        raise TypeError(f"{target} is not callable")
    return factory


def _import_from_working_directory() -> None:
    # Celery puts the working directory on sys.path only while it imports the -A module; keep
    # it there (first, as `python -m` does) for the factories, which import later.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()


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
        raise AgentUnavailable(name, problem) from exc
    if not isinstance(built, Agent):
        returned = f"the factory returned {type(built).__name__}, not an agent.Agent"
        problem = f"agent {name!r} could not be built from {target}: {returned}"
        raise AgentUnavailable(name, problem) from TypeError(returned)
    # A tool's exception text loses this process's secret environment values too.
    built.redact_tool_errors = tool_error_redactor(built.redact_tool_errors)
    return built


@dataclass(frozen=True)
class AgentCheck:
    """One registered agent as its factory builds it now: `error` is None when the factory
    returned an agent.Agent, else why not, in one redacted line."""

    name: str
    factory: str
    error: str | None

    @property
    def builds(self) -> bool:
        return self.error is None


def _one_line(exc: AgentUnavailable) -> str:
    """What went wrong, without the agent's name and factory the caller shows beside them: the
    exception of the factory or of its import (a TypeError when it returned no Agent)."""
    cause = exc.__cause__
    text = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
    return redact(" ".join(text.split()))


def check_registry(agents: Mapping[str, str]) -> list[AgentCheck]:
    """Every registered agent, by name, built once by its factory (imported from the working
    directory, as a worker imports it): what `agentjobs agents` lists and a worker logs at
    start. A factory runs here as it runs for a turn, side effects included."""
    checks = []
    for name in sorted(agents):
        try:
            build_agent(name, agents)
        except AgentUnavailable as exc:
            checks.append(AgentCheck(name, agents[name], _one_line(exc)))
        else:
            checks.append(AgentCheck(name, agents[name], None))
    return checks
