"""Progress frames (tasks/store/progress.py): a base and the frames written after it give back the
very checkpoint the runtime reported, and a round's frame does not grow with the conversation."""

from __future__ import annotations

import pytest

from agent import Agent, AgentRunCheckpoint, Compaction, LLMResponse, ScriptedProvider, ToolCall
from agent import tool as make_tool
from tasks.store.progress import BadProgress, FrameWriter, apply_frames, assemble


@make_tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: shipped"


def reports_of_a_turn(
    stored: AgentRunCheckpoint | None, rounds: int, **options: object
) -> tuple[list[AgentRunCheckpoint], AgentRunCheckpoint]:
    steps = [
        LLMResponse(tool_calls=[ToolCall(f"c{i}", "lookup", {"order_id": f"A{i}"})])
        for i in range(rounds)
    ]
    steps.append(LLMResponse(content="done"))
    agent = Agent(provider=ScriptedProvider(steps), model="m", tools=[lookup], **options)  # type: ignore[arg-type]
    seen: list[AgentRunCheckpoint] = []
    result = agent.run({"message": "where?", "continueFrom": stored}, on_progress=seen.append)
    return seen, result.checkpoint


def conversation(turns: int) -> AgentRunCheckpoint:
    stored = None
    for _ in range(turns):
        _, stored = reports_of_a_turn(stored, rounds=1)
    assert stored is not None
    return stored


def test_frames_on_the_stored_conversation_give_back_each_reported_checkpoint() -> None:
    stored = conversation(3)
    reports, _ = reports_of_a_turn(stored, rounds=3)
    writer, frames = FrameWriter(stored), []
    for report in reports:
        frames.append(writer.frame(report))
        assembled = apply_frames(stored, frames)
        assert assembled is not None and assembled.to_json() == report.to_json()


def test_frames_of_a_first_turn_build_on_nothing() -> None:
    reports, _ = reports_of_a_turn(None, rounds=2)
    writer = FrameWriter(None)
    frames = [writer.frame(report) for report in reports]
    assembled = assemble(None, frames)
    assert assembled is not None
    assert AgentRunCheckpoint.from_parsed(assembled).to_json() == reports[-1].to_json()


def test_a_fold_rewrites_the_history_from_the_start() -> None:
    stored = conversation(6)
    compaction = Compaction(max_messages=8, keep_last=2)
    reports, _ = reports_of_a_turn(stored, rounds=2, compaction=compaction)
    assert any(report.folded for report in reports), "the scenario must fold"
    writer = FrameWriter(stored)
    frames = [writer.frame(report) for report in reports]
    assembled = apply_frames(stored, frames)
    assert assembled is not None and assembled.to_json() == reports[-1].to_json()


def test_a_rounds_frame_does_not_grow_with_the_conversation() -> None:
    sizes = []
    for turns in (2, 40):
        stored = conversation(turns)
        reports, _ = reports_of_a_turn(stored, rounds=3)
        writer = FrameWriter(stored)
        sizes.append([len(writer.frame(report)) for report in reports])
        assert len(stored.to_json()) > 10 * max(sizes[-1]) or turns == 2
    # the same rounds at turn 3 and at turn 41 write frames of the same size, give or take the
    # digits of the bigger run ids and times
    for small, large in zip(sizes[0], sizes[1], strict=True):
        assert abs(small - large) < 40


def test_a_frame_past_its_base_is_refused() -> None:
    stored = conversation(3)
    reports, _ = reports_of_a_turn(stored, rounds=1)
    frame = FrameWriter(stored).frame(reports[-1])
    with pytest.raises(BadProgress, match="history"):
        assemble(None, [frame])
