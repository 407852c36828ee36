"""skillCursor (docs/checkpoint.md, "Top-level keys" and "Skill cursor"): honoured and
written only under a skill graph with
continuity 'conversation'; an id the graph does not know is dropped (a cold start)."""

from __future__ import annotations

from typing import Any

import pytest

from agent import SkillGraph
from tests.agent.support import answer, plain_agent, system_prompts, wire_checkpoint, wire_of

SKILLS = {
    "billing": "SKILL billing: you handle invoices and refunds.",
    "shipping": "SKILL shipping: you track parcels.",
}


def skilled_agent(continuity: str, route: Any = None, steps: int = 1) -> Any:
    graph = SkillGraph(skills=SKILLS, continuity=continuity, route_turn=route)  # type: ignore[arg-type]
    return plain_agent([answer(f"answer {n}") for n in range(steps)], skills=graph)


def continued(agent: Any, cursor: str | None, door: str = "continue") -> None:
    stored = wire_checkpoint() if cursor is None else wire_checkpoint(skillCursor=cursor)
    if door == "continue":
        agent.run({"message": "And my invoice?", "continueFrom": stored})
    else:
        agent.resume_on_error(stored)


@pytest.mark.parametrize("door", ["continue", "resume"])
def test_a_known_cursor_is_honoured_under_conversation_continuity(door: str) -> None:
    agent, provider = skilled_agent("conversation")
    continued(agent, "billing", door)
    assert SKILLS["billing"] in system_prompts(provider)[0]
    assert wire_of(agent)["skillCursor"] == "billing"


def test_the_cursor_survives_follow_ups() -> None:
    agent, provider = skilled_agent("conversation", steps=2)
    continued(agent, "billing")
    agent.follow_up("One more thing.")
    assert SKILLS["billing"] in system_prompts(provider)[1]
    assert wire_of(agent)["skillCursor"] == "billing"


@pytest.mark.parametrize("door", ["continue", "resume"])
def test_an_unknown_cursor_is_dropped(door: str) -> None:
    agent, provider = skilled_agent("conversation")
    continued(agent, "refunds", door)
    assert all(text not in system_prompts(provider)[0] for text in SKILLS.values())
    assert "skillCursor" not in wire_of(agent)


def test_under_turn_continuity_the_stored_cursor_is_read_and_thrown_away() -> None:
    agent, provider = skilled_agent("turn")
    continued(agent, "billing")
    assert SKILLS["billing"] not in system_prompts(provider)[0]
    assert "skillCursor" not in wire_of(agent)


def test_under_turn_continuity_a_routed_skill_is_used_but_not_written() -> None:
    agent, provider = skilled_agent("turn", route=lambda message, cursor: "shipping")
    agent.run("Where is my parcel?")
    assert SKILLS["shipping"] in system_prompts(provider)[0]
    assert "skillCursor" not in wire_of(agent)


def test_a_decisive_route_replaces_the_sticky_cursor() -> None:
    agent, provider = skilled_agent("conversation", route=lambda message, cursor: "shipping")
    continued(agent, "billing")
    assert SKILLS["shipping"] in system_prompts(provider)[0]
    assert wire_of(agent)["skillCursor"] == "shipping"


def test_a_router_that_keeps_the_cursor_leaves_it_sticky() -> None:
    agent, _ = skilled_agent("conversation", route=lambda message, cursor: None)
    continued(agent, "billing")
    assert wire_of(agent)["skillCursor"] == "billing"


def test_an_agent_without_a_skill_graph_drops_the_cursor() -> None:
    agent, _ = plain_agent([answer("ok")])
    continued(agent, "billing")
    assert "skillCursor" not in wire_of(agent)


def test_a_fresh_conversation_has_no_cursor_until_one_is_routed() -> None:
    agent, _ = skilled_agent("conversation")
    agent.run("hello")
    assert "skillCursor" not in wire_of(agent)
