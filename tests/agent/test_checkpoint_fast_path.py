"""The load fast path (agent/checkpoint.py `_scan_history`) against the slow path.

Loading skips the number walk when the scan of history says no number needs renumbering; the
bytes written must be those of a load that always renumbers (normalize_in_place on every tree),
and whenever the scan answers, its answer must be the walk's (needs_js_numbers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import AgentRunCheckpoint
from agent import checkpoint as checkpoint_module
from agent.checkpoint import _scan_history, _validate
from agent.jsnumbers import needs_js_numbers

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures").rglob("*.checkpoint.json"))


def slow_to_json(raw: bytes) -> bytes:
    """A load that renumbers whatever the scan says."""
    value = orjson.loads(raw)
    _validate(value)
    return AgentRunCheckpoint._wrap(value, True).to_json()


def check_same(raw: bytes) -> None:
    assert AgentRunCheckpoint.from_json(raw).to_json() == slow_to_json(raw)
    history = orjson.loads(raw)["history"]
    scanned = _scan_history(history)
    if scanned is not None:
        assert scanned == needs_js_numbers(history)


def test_fixtures_are_found() -> None:
    assert len(FIXTURES) >= 5


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_reference_fixtures_fast_path_matches_slow_path(path: Path) -> None:
    check_same(path.read_bytes())


TRICKY_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -2.0,
    2.5,
    1e21,
    1e-7,
    1e-6,
    5e-324,
    1.7976931348623157e308,
    2.0**53,
    2.0**60,
    2.0**64,
    1e16,
    123456789012345680.0,
    0.1,
    -1e-5,
    1.5e300,
]
TRICKY_INTS = [0, 1, -1, 2**53, 2**53 + 1, -(2**53) - 1, 2**63, 2**64 - 1]

numbers = st.one_of(
    st.sampled_from(TRICKY_FLOATS),
    st.sampled_from(TRICKY_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
)
leaves = st.one_of(st.text(max_size=5), st.booleans(), st.none(), numbers)
trees = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
text = st.text(max_size=8)
# The scan's own shape: args of strings, booleans and integers, around the safe-integer edge too.
flat_args = st.dictionaries(
    text,
    text | st.booleans() | st.sampled_from(TRICKY_INTS) | st.integers(-(2**53), 2**53),
    max_size=3,
)
well_formed_calls = st.fixed_dictionaries(
    {"id": text, "name": text, "args": flat_args | st.dictionaries(text, trees, max_size=3)}
)
# Calls the scan must hand to the walk: a key missing, one more, or a number where a string goes.
odd_calls = st.dictionaries(
    st.sampled_from(["id", "name", "args", "providerMeta"]), text | trees | flat_args, max_size=4
)
calls = well_formed_calls | odd_calls
extra = st.dictionaries(
    st.sampled_from(["x", "meta", "toolCallId", "toolName", "toolCalls"]), trees, max_size=2
)
messages = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": text}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": text, "toolCalls": st.lists(calls, max_size=3)}
    ),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": text, "toolCalls": trees}),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": text, "toolCallId": text | trees, "toolName": text}
    ),
    st.builds(
        lambda base, more: {**more, **base},
        st.fixed_dictionaries({"role": text, "content": text}),
        extra,
    ),
)


def checkpoint(history: list[dict[str, Any]], top: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "version": 1,
            "runId": "r",
            "history": history,
            "lastCompletedIteration": 2,
            "originalInput": {"message": "hi"},
        }
        | top
    )


@settings(max_examples=400, deadline=None)
@given(
    st.lists(messages, max_size=6),
    st.dictionaries(
        st.sampled_from(["x", "claimVerification"]),
        st.dictionaries(text, trees, max_size=3),
        max_size=2,
    ),
)
def test_generated_trees_fast_path_matches_slow_path(
    history: list[dict[str, Any]], top: dict[str, Any]
) -> None:
    check_same(checkpoint(history, top))


@pytest.mark.parametrize(
    "number",
    [
        b"1.0",
        b"-0.0",
        b"-0",
        b"1e21",
        b"1E21",
        b"1e-7",
        b"5e-324",
        b"100000000000000000000",
        b"9007199254740993",
        b"18446744073709551615",
        b"0.000001",
        b"2.50",
        b"7",
        b"9007199254740992",
        b"-9007199254740992",
        b"-9007199254740993",
        b"true",
    ],
)
@pytest.mark.parametrize(
    "message",
    [
        b'{"role":"assistant","content":"","toolCalls":[{"id":"c","name":"n","args":{"q":%s}}]}',
        b'{"role":"assistant","content":"","toolCalls":[{"id":"c","name":"n","args":{"a":"x",'
        b'"b":false,"c":3,"q":%s}}]}',
        b'{"role":"assistant","content":"","toolCalls":[{"id":"c","name":"n","args":{}},'
        b'{"id":"d","name":"n","args":{"q":%s}}]}',
        b'{"role":"assistant","content":"","toolCalls":[{"id":%s,"name":"n","args":{}}]}',
        b'{"role":"assistant","content":"","toolCalls":[{"id":"c","name":"n","q":%s}]}',
        b'{"role":"assistant","content":"","toolCalls":[{"id":"c","name":"n","args":[%s]}]}',
        b'{"role":"assistant","content":"","toolCalls":{"q":%s}}',
        b'{"role":"tool","content":"","toolCallId":"c","toolName":"n","n":%s}',
        b'{"role":"tool","content":"","toolCallId":%s,"toolName":"n"}',
        b'{"role":"tool","content":"","toolCallId":"c","n":%s}',
        b'{"role":"user","content":"","n":%s}',
        b'{"role":"user","content":"","n":[{"m":%s}]}',
    ],
)
def test_written_numbers_fast_path_matches_slow_path(number: bytes, message: bytes) -> None:
    history = b'[{"role":"user","content":"hi"},' + message % number + b"]"
    raw = (
        b'{"version":1,"runId":"r","history":%s,"lastCompletedIteration":2,'
        b'"originalInput":{"message":"hi"}}' % history
    )
    check_same(raw)


def test_the_usual_shapes_are_decided_without_a_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text, tool results, and tool calls whose args are strings, booleans or safe integers: the
    scan answers from type tests alone (the walk is the cost it exists to save)."""

    def walk(value: Any) -> bool:
        raise AssertionError(f"walked {value!r}")

    monkeypatch.setattr(checkpoint_module, "needs_js_numbers", walk)
    call = {"id": "c1", "name": "order", "args": {"id": "A-1", "qty": 2**53, "gift": True}}
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "toolCalls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "content": "{}", "toolCallId": "c1", "toolName": "order"},
        {"role": "assistant", "content": "Shipped."},
    ]
    assert _scan_history(history) is False
