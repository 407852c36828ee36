"""Properties of the codec over generated checkpoints: loading and writing is the identity on
every valid v1 checkpoint (all optional fields, unknown keys included) up to what JSON numbers
are to the reference (one double each, written as JSON.stringify writes it), and nothing but a
CheckpointFormatError ever escapes from loading arbitrary or damaged bytes (D6)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import AgentRunCheckpoint, CheckpointFormatError
from agent.jsnumbers import js_number_text

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

KNOWN_TOP_LEVEL = {
    "version",
    "runId",
    "history",
    "lastCompletedIteration",
    "originalInput",
    "checkpointedAt",
    "failurePoint",
    "folded",
    "findingsLedger",
    "claimVerification",
    "turnNumber",
    "evidenceRecovery",
    "identity",
    "skillCursor",
    "agent",
}
KNOWN_MESSAGE_KEYS = {
    "role",
    "content",
    "toolCallId",
    "toolName",
    "toolCalls",
    "thinkingBlocks",
    "ephemeral",
    "injectedBy",
}

# JSON text: any code point but lone surrogates, which UTF-8 (hence JSON bytes) cannot carry.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
non_empty_text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20)
safe_int = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
number = st.one_of(safe_int, st.floats(allow_nan=False, allow_infinity=False))
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), number, text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)
json_object = st.dictionaries(text, json_value, max_size=4)


def unknown_keys(known: set[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(text.filter(lambda k: k not in known), json_value, max_size=3)


def with_optional(
    required: st.SearchStrategy[dict[str, Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda base, extra: {**base, **extra},
        required,
        st.fixed_dictionaries({}, optional=optional),
    )


tool_call = with_optional(
    st.fixed_dictionaries({"id": text, "name": text, "args": json_object}),
    {"providerMeta": json_object},
)
thinking_block = with_optional(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["thinking", "redacted_thinking"]), "content": text}
    ),
    {"signature": text, "summary": st.booleans(), "providerMeta": json_object},
)
message = st.builds(
    lambda base, unknown: {**unknown, **base},
    with_optional(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["system", "user", "assistant", "tool"]) | text,
                "content": text,
            }
        ),
        {
            "toolCallId": text,
            "toolName": text,
            "toolCalls": st.lists(tool_call, max_size=3),
            "thinkingBlocks": st.lists(thinking_block, max_size=2),
            "ephemeral": st.booleans(),
            "injectedBy": st.fixed_dictionaries(
                {"injectionId": text, "flavor": text, "iteration": safe_int},
                optional={"reason": text},
            ),
        },
    ),
    unknown_keys(KNOWN_MESSAGE_KEYS),
)

span = st.builds(
    lambda base, retained, messages: (
        {**base, "retained": "conversation", "messages": messages}
        if retained
        else {**base, "retained": "discard"}
    ),
    st.fixed_dictionaries(
        {
            "summaryFingerprint": text,
            "runId": text,
            "iteration": safe_int,
            "foldedAtMs": safe_int,
            "model": text,
            "messageCount": safe_int,
            "removedStageIds": st.lists(text, max_size=3),
        }
    ),
    st.booleans(),
    st.lists(message, max_size=3),
)

turn = {"turn": number}
basis_row = with_optional(
    st.fixed_dictionaries(
        {
            "kind": st.just("basis"),
            "toolCallId": text,
            "toolName": text,
            "iteration": number,
            "basis": st.sampled_from(["direct", "exploratory"]),
        }
    ),
    {
        "expect": st.sampled_from(["low", "medium", "high"]),
        "proposition": text,
        "predicts": text,
        "malformed": safe_int,
        **turn,
    },
)
standing_row = with_optional(
    st.fixed_dictionaries(
        {
            "kind": st.just("standing"),
            "toolCallId": text,
            "standing": st.sampled_from(["fact", "open", "noise", "ruled-out"]),
            "assertions": st.lists(json_value, max_size=3),
            "declaredOn": st.just("answer") | st.fixed_dictionaries({"toolCallId": text}),
            "iteration": number,
        }
    ),
    {
        "toolName": text,
        "ref": text,
        "sought": text,
        "settles": text,
        "line": json_value,
        "unknownId": st.just(True),
        **turn,
    },
)
conflict_row = with_optional(
    st.fixed_dictionaries(
        {
            "kind": st.just("conflict"),
            "key": text,
            "witnesses": st.lists(
                st.fixed_dictionaries(
                    {
                        "toolCallId": text,
                        "subject": st.fixed_dictionaries({"kind": text, "id": text}),
                        "predicate": json_value,
                    }
                ),
                max_size=3,
            ),
            "iteration": number,
        }
    ),
    turn,
)
later_row = st.builds(
    lambda kind, rest: {**rest, "kind": kind},
    st.sampled_from(
        [
            "judgment",
            "judgment-error",
            "contingent",
            "unsettled-by-absence",
            "argument",
            "period",
            "grounded",
            "steps-unfinished",
            "clock",
            "clock-on-resume",
            "call",
        ]
    ),
    st.dictionaries(text.filter(lambda k: k not in ("kind", "turn")), json_value, max_size=3),
)
ledger_row = st.one_of(basis_row, standing_row, conflict_row, later_row)

identity = st.fixed_dictionaries(
    {"conversationId": text}, optional={"tenant": text, "principal": text}
)
failure_point = st.fixed_dictionaries(
    {"iteration": safe_int, "phase": st.sampled_from(["iteration", "tool", "llm", "unknown"])},
    optional={"stage": text},
)
evidence_recovery = st.fixed_dictionaries(
    {"revisionSpent": st.just(True)},
    optional={"pending": st.fixed_dictionaries({"instruction": non_empty_text})},
)

checkpoint_wire = st.builds(
    lambda base, unknown: {**unknown, **base},
    with_optional(
        st.fixed_dictionaries(
            {
                "version": st.just(1),
                "runId": text,
                "history": st.lists(message, max_size=5),
                "lastCompletedIteration": number,
                "originalInput": st.fixed_dictionaries({"message": text}),
            }
        ),
        {
            "checkpointedAt": safe_int,
            "failurePoint": failure_point,
            "folded": st.lists(span, max_size=3),
            "findingsLedger": st.lists(ledger_row, max_size=4),
            "claimVerification": json_object,
            "turnNumber": st.integers(min_value=1, max_value=2**53 - 1),
            "evidenceRecovery": evidence_recovery,
            "identity": identity,
            "skillCursor": text,
            "agent": st.fixed_dictionaries({"id": text}),
        },
    ),
    unknown_keys(KNOWN_TOP_LEVEL),
)


# ---------------------------------------------------------------------------------------------
# round trips


def as_doubles(value: Any) -> Any:
    """Every number as the one double JavaScript holds for it: 2 and 2.0 are the same number
    there, and so are 2**60 and 1152921504606847000."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        return {key: as_doubles(item) for key, item in value.items()}
    return [as_doubles(item) for item in value]


def written_numbers(data: bytes) -> list[str]:
    """The text of every number token in JSON `data`, as written."""
    tokens: list[str] = []

    def keep(text: str) -> str:
        tokens.append(text)
        return text

    json.loads(data, parse_int=keep, parse_float=keep)
    return tokens


def assert_written_as_the_reference_does(data: bytes) -> None:
    for token in written_numbers(data):
        assert token == js_number_text(float(token)), f"{token} is not how JavaScript writes it"


@SETTINGS
@given(checkpoint_wire)
def test_from_dict_then_to_dict_is_the_identity(wire: dict[str, Any]) -> None:
    assert as_doubles(AgentRunCheckpoint.from_dict(wire).to_dict()) == as_doubles(wire)


@SETTINGS
@given(checkpoint_wire)
def test_from_json_of_to_json_is_the_identity(wire: dict[str, Any]) -> None:
    checkpoint = AgentRunCheckpoint.from_dict(wire)
    again = AgentRunCheckpoint.from_json(checkpoint.to_json())
    assert again == checkpoint
    assert again.to_json() == checkpoint.to_json()
    loaded = AgentRunCheckpoint.from_json(orjson.dumps(wire)).to_dict()
    assert as_doubles(loaded) == as_doubles(wire)


@SETTINGS
@given(checkpoint_wire)
def test_every_number_written_is_written_as_the_reference_writes_it(wire: dict[str, Any]) -> None:
    # orjson.dumps(wire) writes Python's floats (2.0, -0.0, 1e-6): a checkpoint written with
    # floats is written back as JavaScript would write it.
    assert_written_as_the_reference_does(AgentRunCheckpoint.from_dict(wire).to_json())
    assert_written_as_the_reference_does(AgentRunCheckpoint.from_json(orjson.dumps(wire)).to_json())


# ---------------------------------------------------------------------------------------------
# fuzz: only CheckpointFormatError escapes


def load_or_refuse(data: bytes | str) -> None:
    """Loading either succeeds with a checkpoint that writes and reads back, or fails by name."""
    try:
        checkpoint = AgentRunCheckpoint.from_json(data)
    except CheckpointFormatError as error:
        assert error.field, "the error names a field"
        return
    assert AgentRunCheckpoint.from_json(checkpoint.to_json()) == checkpoint


@SETTINGS
@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_format_errors(data: bytes) -> None:
    load_or_refuse(data)


@SETTINGS
@given(json_value)
def test_arbitrary_json_raises_only_format_errors(value: Any) -> None:
    load_or_refuse(orjson.dumps(value))


mutation = st.sampled_from(["drop", "replace", "message", "message-field", "row", "row-field"])


@SETTINGS
@given(checkpoint_wire, mutation, json_value, st.data())
def test_damaged_checkpoints_raise_only_format_errors(
    wire: dict[str, Any], how: str, junk: Any, data: st.DataObject
) -> None:
    damaged = dict(wire)
    keys = sorted(KNOWN_TOP_LEVEL)
    if how in ("drop", "replace"):
        key = data.draw(st.sampled_from(keys))
        if how == "drop":
            damaged.pop(key, None)
        else:
            damaged[key] = junk
    elif how.startswith("message") and damaged["history"]:
        history = list(damaged["history"])
        index = data.draw(st.integers(0, len(history) - 1))
        if how == "message":
            history[index] = junk
        else:
            field = data.draw(st.sampled_from(sorted(KNOWN_MESSAGE_KEYS)))
            history[index] = {**history[index], field: junk}
        damaged["history"] = history
    elif how.startswith("row"):
        rows = list(damaged.get("findingsLedger") or [data.draw(ledger_row)])
        index = data.draw(st.integers(0, len(rows) - 1))
        if how == "row":
            rows[index] = junk
        else:
            field = data.draw(st.sampled_from([*sorted(rows[index]), "kind", "turn"]))
            rows[index] = {**rows[index], field: junk}
        damaged["findingsLedger"] = rows
    load_or_refuse(orjson.dumps(damaged))


@SETTINGS
@given(checkpoint_wire, st.lists(st.tuples(st.integers(0, 10_000), st.binary(max_size=3))))
def test_byte_level_damage_raises_only_format_errors(
    wire: dict[str, Any], edits: list[tuple[int, bytes]]
) -> None:
    data = bytearray(orjson.dumps(wire))
    for position, replacement in edits:
        at = position % (len(data) + 1)
        data[at : at + len(replacement)] = replacement
    load_or_refuse(bytes(data))


NESTED = {
    "findingsLedger": st.lists(ledger_row, min_size=1, max_size=2),
    "failurePoint": failure_point,
    "evidenceRecovery": evidence_recovery.map(
        lambda e: {**e, "pending": e.get("pending", {"instruction": "x"})}
    ),
    "identity": identity,
    "agent": st.fixed_dictionaries({"id": text}),
    "folded": st.lists(span, min_size=1, max_size=2),
}


@SETTINGS
@given(st.sampled_from(sorted(NESTED)), json_value, st.data())
def test_damage_inside_a_known_nested_shape_raises_only_format_errors(
    key: str, junk: Any, data: st.DataObject
) -> None:
    value: Any = data.draw(NESTED[key])
    # Pick one object inside the value and overwrite one of its keys with junk.
    target: dict[str, Any] = value[0] if isinstance(value, list) else value
    if key == "evidenceRecovery" and data.draw(st.booleans()):
        target = target["pending"] = dict(target["pending"])
    field = data.draw(st.sampled_from(sorted(target)))
    target[field] = junk
    wire = {
        "version": 1,
        "runId": "run-1-1",
        "history": [],
        "lastCompletedIteration": 0,
        "originalInput": {"message": "m"},
        key: value,
    }
    load_or_refuse(orjson.dumps(wire))
