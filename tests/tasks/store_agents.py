"""An agent whose tool rounds are recorded outside Redis, for tests that make Redis refuse
writes (tests/tasks/test_hard_edges.py): each tool start appends a line to a file in
$TEST_RUNS_DIR, so what ran is known however the store behaved."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent import Agent, LLMRequest, LLMResponse, ToolCall, ToolContext, tool

# A tool result this large makes every round's progress write a large one, as with real tools.
RESULT_CHARS = 60_000


class _RoundsProvider:
    """`<tag> rounds:<n>`: asks for step(1) .. step(n), one per response, then answers."""

    name = "rounds"

    def complete(self, request: LLMRequest) -> LLMResponse:
        tag, rounds = str(request.messages[0]["content"]).split()
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        if done >= int(rounds.removeprefix("rounds:")):
            return LLMResponse(content=f"{tag} done after {done} steps")
        call = ToolCall(id=f"s{done + 1}", name="step", args={"tag": tag, "n": done + 1})
        return LLMResponse(tool_calls=[call])


@tool
def step(tag: str, n: int, ctx: ToolContext) -> str:
    """Do step n; each start is recorded with its idempotency key."""
    with (Path(os.environ["TEST_RUNS_DIR"]) / tag).open("a") as runs:
        runs.write(f"{n} {ctx.idempotency_key}\n")
    time.sleep(0.3)
    return f"step {n} " + "x" * RESULT_CHARS


def build_store_rounds() -> Agent:
    return Agent(provider=_RoundsProvider(), model="test-model", tools=[step])
