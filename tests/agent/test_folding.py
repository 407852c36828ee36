"""Folded spans (docs/checkpoint.md, "Folding", D4, D8): fnv1a over UTF-16 code units,
joining a summary
to its span by fingerprint, compaction writing spans, and every agent keeping them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from agent import (
    AgentRunCheckpoint,
    Compaction,
    ProviderHTTPError,
    RunCheckpointError,
    fnv1a,
    folded_messages,
    folded_span_for,
    is_compacted_summary,
)
from tests.agent.support import (
    answer,
    lookup_order,
    plain_agent,
    sent_messages,
    tool_call,
    wire_checkpoint,
    wire_of,
)

EMOJI = "\U0001f600"


def utf16_code_units(text: str) -> Iterator[int]:
    """UTF-16 by hand (no codec): a code point above the BMP becomes a surrogate pair."""
    for char in text:
        point = ord(char)
        if point < 0x10000:
            yield point
        else:
            point -= 0x10000
            yield 0xD800 + (point >> 10)
            yield 0xDC00 + (point & 0x3FF)


def expected_fnv1a(units: Iterator[int]) -> str:
    h = 2166136261
    for unit in units:
        h ^= unit
        h = (h * 16777619) % 2**32
    return f"{h:x}"


def test_edge_case_7_the_empty_string_hashes_to_the_offset_basis() -> None:
    assert fnv1a("") == "811c9dc5"


@pytest.mark.parametrize(
    ("text", "digest"),
    [("a", "e40c292c"), ("foobar", "bf9cf968")],  # the published FNV-1a 32-bit test vectors
)
def test_ascii_matches_the_published_vectors(text: str, digest: str) -> None:
    assert fnv1a(text) == digest


@pytest.mark.parametrize(
    "text",
    [
        EMOJI,
        f"order shipped {EMOJI}",
        "\U0001f469\u200d\U0001f4bb",  # a ZWJ sequence
        "日本語のテキスト",
        "e\u0301",  # combining accent
        "[compacted history: 3 messages]\nearlier user requests: où est ma commande ? 📦",
    ],
)
def test_text_hashes_by_utf16_code_units(text: str) -> None:
    assert fnv1a(text) == expected_fnv1a(utf16_code_units(text))


def test_hashing_code_points_would_give_a_different_answer_for_an_emoji() -> None:
    by_code_point = expected_fnv1a(ord(c) for c in EMOJI)
    assert fnv1a(EMOJI) != by_code_point


def test_the_hex_is_lowercase_and_never_zero_padded() -> None:
    small = next(
        text
        for text in (f"k{n}" for n in range(10_000))
        if len(expected_fnv1a(utf16_code_units(text))) < 8
    )
    digest = fnv1a(small)
    assert digest == expected_fnv1a(utf16_code_units(small))
    assert len(digest) < 8 and not digest.startswith("0")
    assert all(fnv1a(t) == fnv1a(t).lower() for t in ("ABC", "Zz", EMOJI))


# ---------------------------------------------------------------------------------------------
# folded_span_for


def summary(text: str) -> dict[str, Any]:
    return {"role": "user", "content": f"[compacted history: 2 messages]\n{text}"}


def span(message: dict[str, Any], **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "summaryFingerprint": fnv1a(message["content"]),
        "runId": "run-1700000000000-1",
        "iteration": 1,
        "foldedAtMs": 1700000000000,
        "model": "mock-model",
        "messageCount": 2,
        "removedStageIds": [],
        "retained": "discard",
    }
    base.update(fields)
    return base


def test_no_folded_means_none() -> None:
    message = summary("anything")
    assert folded_span_for(AgentRunCheckpoint.from_dict(wire_checkpoint()), message) is None
    assert folded_span_for(wire_checkpoint(folded=[]), message) is None
    assert folded_span_for(wire_checkpoint(), message) is None


def test_the_span_is_found_by_fingerprint_not_by_index() -> None:
    older, newer = summary("older"), summary("newer")
    spans = [span(older, iteration=1), span(newer, iteration=4)]
    # The newer summary sits first in history; the join must not care.
    history = [newer, {"role": "user", "content": "hi"}, older]
    checkpoint = AgentRunCheckpoint.from_dict(wire_checkpoint(history=history, folded=spans))
    assert folded_span_for(checkpoint, history[0]) == spans[1]
    assert folded_span_for(checkpoint, history[2]) == spans[0]
    assert folded_span_for(checkpoint, history[1]) is None


def test_the_first_matching_span_wins() -> None:
    message = summary("same")
    spans = [span(message, iteration=1), span(message, iteration=2)]
    assert folded_span_for(wire_checkpoint(folded=spans), message) == spans[0]


def test_an_imitated_frame_does_not_match() -> None:
    real = summary("the real one")
    imitation = {"role": "user", "content": "[compacted history: 2 messages] the real one"}
    assert folded_span_for(wire_checkpoint(folded=[span(real)]), imitation) is None


def test_folded_messages_concatenates_retained_spans_only() -> None:
    a = [{"role": "user", "content": "a"}]
    b = [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    spans = [
        span(summary("1"), retained="conversation", messages=a),
        span(summary("2")),
        span(summary("3"), retained="conversation", messages=b),
    ]
    assert folded_messages(wire_checkpoint(folded=spans)) == a + b
    assert folded_messages(wire_checkpoint()) == []


def test_a_summary_is_recognized_by_its_prefix_only() -> None:
    assert is_compacted_summary(summary("x"))
    assert is_compacted_summary({"role": "assistant", "content": "[compacted history"})
    assert not is_compacted_summary({"role": "user", "content": " [compacted history"})


# ---------------------------------------------------------------------------------------------
# Compaction writes spans; D4


def rounds(count: int, final: str = "done") -> list[Any]:
    steps: list[Any] = [
        tool_call(f"call_{n}", "lookup_order", orderId=f"A-{n}") for n in range(1, count + 1)
    ]
    return [*steps, answer(final)]


def compacting_agent(steps: list[Any], retain: str = "conversation") -> Any:
    return plain_agent(
        steps,
        tools=[lookup_order],
        compaction=Compaction(max_messages=4, keep_last=2, retain=retain),  # type: ignore[arg-type]
    )


def assert_d4(wire: dict[str, Any]) -> None:
    """Every span this runtime wrote has its summary message in history."""
    for each in wire["folded"]:
        matches = [m for m in wire["history"] if fnv1a(m["content"]) == each["summaryFingerprint"]]
        assert matches, f"no summary in history for the span of iteration {each['iteration']}"
        assert all(is_compacted_summary(m) for m in matches)


def test_retain_conversation_writes_spans_with_their_messages() -> None:
    agent, _ = compacting_agent(rounds(3))
    result = agent.run("Where are A-1, A-2 and A-3?")
    wire = wire_of(agent)
    assert wire["folded"], "three rounds overflow max_messages=4"
    first = wire["folded"][0]
    assert first["retained"] == "conversation"
    assert first["messages"][0] == {"role": "user", "content": "Where are A-1, A-2 and A-3?"}
    assert first["messageCount"] == len(first["messages"])
    assert first["runId"] == result.run_id and first["model"] == "mock-model"
    assert isinstance(first["foldedAtMs"], int) and isinstance(first["iteration"], int)
    assert isinstance(first["removedStageIds"], list)
    assert_d4(wire)


def test_retain_discard_writes_spans_without_a_messages_key() -> None:
    agent, _ = compacting_agent(rounds(3), retain="discard")
    agent.run("Where are A-1, A-2 and A-3?")
    wire = wire_of(agent)
    assert wire["folded"]
    for each in wire["folded"]:
        assert each["retained"] == "discard"
        assert "messages" not in each
        assert each["messageCount"] > 0
    assert_d4(wire)


def test_d4_holds_after_a_second_fold_and_spans_stay_oldest_first() -> None:
    agent, _ = compacting_agent(rounds(5))
    agent.run("Where are my five orders?")
    wire = wire_of(agent)
    assert len(wire["folded"]) >= 2
    iterations = [each["iteration"] for each in wire["folded"]]
    assert iterations == sorted(iterations)
    assert_d4(wire)


def test_every_span_written_is_reachable_from_its_own_summary() -> None:
    # The join is by fingerprint only and the first match wins ("Folding"): two folds whose
    # summaries
    # read the same would leave the later span unreachable from any message in history.
    agent, _ = compacting_agent(rounds(5))
    agent.run("Where are my five orders?")
    wire = wire_of(agent)
    reachable = [folded_span_for(wire, m) for m in wire["history"] if is_compacted_summary(m)]
    for each in wire["folded"]:
        assert each in reachable, f"the span of iteration {each['iteration']} cannot be joined"


def test_the_model_is_sent_the_summary_instead_of_the_folded_messages() -> None:
    agent, provider = compacting_agent(rounds(3))
    agent.run("Where are A-1, A-2 and A-3?")
    last = sent_messages(provider, len(provider.requests) - 1)
    assert is_compacted_summary(last[0])
    assert all(m["content"] != "Where are A-1, A-2 and A-3?" for m in last)
    assert (
        last[next(i for i, m in enumerate(last) if not is_compacted_summary(m))]["role"] != "tool"
    )


def test_d4_holds_in_a_crash_checkpoint_after_a_fold() -> None:
    steps = [*rounds(2)[:-1], ProviderHTTPError("overloaded", status=503)]
    agent, _ = compacting_agent(steps)
    with pytest.raises(RunCheckpointError) as caught:
        agent.run("Where are A-1 and A-2?")
    wire = caught.value.checkpoint.to_dict()
    assert wire["folded"]
    assert_d4(wire)
    assert_d4(wire_of(agent))


def test_new_spans_are_appended_after_restored_ones() -> None:
    reference_span = span(summary("from the reference runtime"))  # no summary in history (D8)
    stored = wire_checkpoint(folded=[reference_span])
    agent, _ = compacting_agent(rounds(3))
    agent.run({"message": "And A-1, A-2, A-3?", "continueFrom": stored})
    folded = wire_of(agent)["folded"]
    assert folded[0] == reference_span, "carried as it is, not repaired or refused"
    assert len(folded) >= 2
    assert_d4({"history": wire_of(agent)["history"], "folded": folded[1:]})


# ---------------------------------------------------------------------------------------------
# every agent restores folded


@pytest.mark.parametrize("door", ["continue", "resume", "follow_up"])
def test_an_agent_without_compaction_keeps_the_spans(door: str) -> None:
    kept = summary("kept")
    spans = [
        span(kept, retained="conversation", messages=[{"role": "user", "content": "old"}]),
        span(summary("discarded")),
    ]
    stored = wire_checkpoint(history=[kept, {"role": "user", "content": "hi"}], folded=spans)
    agent, _ = plain_agent([answer("a"), answer("b")])
    if door == "continue":
        agent.run({"message": "next", "continueFrom": stored})
    elif door == "resume":
        agent.resume_on_error(orjson.dumps(stored))
    else:
        agent.run({"message": "next", "continueFrom": stored})
        agent.follow_up("again")
    wire = wire_of(agent)
    assert wire["folded"] == spans
    assert folded_span_for(wire, kept) == spans[0]


def test_no_fold_means_no_folded_key() -> None:
    agent, _ = compacting_agent(rounds(1))
    agent.run("Where is A-1?")
    assert "folded" not in wire_of(agent)
