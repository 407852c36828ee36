"""A small skill graph: which skill instructions join the system prompt, and the cursor that a
conversation carries between turns when the graph declares continuity 'conversation'."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

# route(message, cursor) -> the skill for this turn, or None to keep the cursor as it is.
Router = Callable[[str, "str | None"], "str | None"]


@dataclass(frozen=True)
class SkillGraph:
    skills: Mapping[str, str]
    continuity: Literal["turn", "conversation"] = "turn"
    route_turn: Router | None = None

    def __post_init__(self) -> None:
        if self.continuity not in ("turn", "conversation"):
            raise ValueError("SkillGraph.continuity must be 'turn' or 'conversation'")

    def restore(self, cursor: str | None) -> str | None:
        """The stored cursor as this turn's sticky default: honoured only under continuity
        'conversation', and dropped (a cold start) when this graph does not know the skill."""
        if self.continuity != "conversation" or not cursor or cursor not in self.skills:
            return None
        return cursor

    def route(self, message: str, cursor: str | None) -> str | None:
        if self.route_turn is None:
            return cursor
        picked = self.route_turn(message, cursor)
        return picked if picked in self.skills else cursor

    def instruction(self, skill_id: str) -> str:
        return self.skills[skill_id]
