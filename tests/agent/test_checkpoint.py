"""AgentRunCheckpoint v1 (docs/checkpoint.md): the one validator ("Validation"), the wire shape
("Top-level keys", "Serialization", "Nested shapes") and
the codec. Every refusal is a CheckpointFormatError whose `.field` names what is wrong."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent import AgentRunCheckpoint, CheckpointFormatError, validate_checkpoint
from tests.agent.support import drop, wire_checkpoint

REQUIRED_KEYS = {
    "version",
    "runId",
    "history",
    "lastCompletedIteration",
    "originalInput",
    "checkpointedAt",
}
EMOJI = "\U0001f600"  # outside the BMP: one code point, two UTF-16 code units


def refused(payload: Any) -> CheckpointFormatError:
    """Load `payload` through both dict doors; both must refuse it the same way."""
    with pytest.raises(CheckpointFormatError) as from_dict:
        AgentRunCheckpoint.from_dict(payload)
    with pytest.raises(CheckpointFormatError) as validated:
        validate_checkpoint(payload)
    assert validated.value.field == from_dict.value.field
    return from_dict.value


def refused_json(data: bytes | str) -> CheckpointFormatError:
    with pytest.raises(CheckpointFormatError) as caught:
        AgentRunCheckpoint.from_json(data)
    return caught.value


def loads(payload: dict[str, Any]) -> AgentRunCheckpoint:
    checkpoint = AgentRunCheckpoint.from_dict(payload)
    assert AgentRunCheckpoint.from_json(orjson.dumps(payload)) == checkpoint
    return checkpoint


# ---------------------------------------------------------------------------------------------
# the error itself


def test_format_error_is_a_typed_type_error_naming_the_field() -> None:
    error = refused(wire_checkpoint(lastCompletedIteration="one"))
    assert isinstance(error, TypeError)
    assert error.code == "ERR_CHECKPOINT_FORMAT"
    assert error.field == "lastCompletedIteration"
    assert "lastCompletedIteration" in str(error)


def test_a_valid_checkpoint_loads_through_every_door() -> None:
    payload = wire_checkpoint()
    checkpoint = loads(payload)
    assert checkpoint.run_id == payload["runId"]
    assert checkpoint.history == payload["history"]
    assert checkpoint.original_input == {"message": "Where is my order A-17?"}
    assert AgentRunCheckpoint.from_json(orjson.dumps(payload).decode()) == checkpoint


# ---------------------------------------------------------------------------------------------
# "Validation", check by check


@pytest.mark.parametrize("value", [None, [], [wire_checkpoint()], "checkpoint", 1, True, 0.5])
def test_check_1_a_value_that_is_not_an_object_is_refused(value: Any) -> None:
    error = refused(value)
    assert "not an object" in str(error)
    assert "not an object" in str(refused_json(orjson.dumps(value)))


@pytest.mark.parametrize("version", [1, 1.0])
def test_check_2_version_one_is_read_as_int_or_float(version: Any) -> None:
    assert loads(wire_checkpoint(version=version)).version == 1


@pytest.mark.parametrize("version", [2, 0, -1, 1.5, True, False, "1", None, [1], {"v": 1}])
def test_check_2_any_other_version_is_refused(version: Any) -> None:
    error = refused(wire_checkpoint(version=version))
    assert error.field == "version"
    assert "unsupported checkpoint version" in str(error)


def test_check_2_a_missing_version_is_refused() -> None:
    error = refused(drop(wire_checkpoint(), "version"))
    assert error.field == "version"
    assert "unsupported checkpoint version" in str(error)


def test_check_2_true_is_refused_from_json_even_though_true_equals_one() -> None:
    data = orjson.dumps(wire_checkpoint()).replace(b'"version":1', b'"version":true')
    assert refused_json(data).field == "version"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"runId": 7}, "runId"),
        ({"runId": None}, "runId"),
        ({"history": {"0": {"role": "user", "content": "x"}}}, "history"),
        ({"history": "[]"}, "history"),
        ({"history": None}, "history"),
    ],
)
def test_check_3_run_id_and_history_are_named_together(fields: dict[str, Any], field: str) -> None:
    error = refused(wire_checkpoint(**fields))
    assert error.field == field
    assert "runId" in str(error) and "history" in str(error)


@pytest.mark.parametrize("missing", ["runId", "history"])
def test_check_3_a_missing_run_id_or_history_is_refused(missing: str) -> None:
    error = refused(drop(wire_checkpoint(), missing))
    assert error.field == missing
    assert "required" in str(error)


@pytest.mark.parametrize("value", ["1", None, True, [1], {"n": 1}])
def test_check_4_last_completed_iteration_must_be_a_number(value: Any) -> None:
    error = refused(wire_checkpoint(lastCompletedIteration=value))
    assert error.field == "lastCompletedIteration"


def test_check_4_a_missing_last_completed_iteration_is_refused() -> None:
    error = refused(drop(wire_checkpoint(), "lastCompletedIteration"))
    assert error.field == "lastCompletedIteration"


@pytest.mark.parametrize("value", [0, 3, 2.5, -1])
def test_check_4_any_number_is_a_last_completed_iteration(value: Any) -> None:
    assert loads(wire_checkpoint(lastCompletedIteration=value)).last_completed_iteration == value


def test_check_5_a_missing_original_input_is_named() -> None:
    error = refused(drop(wire_checkpoint(), "originalInput"))
    assert error.field == "originalInput"
    assert "originalInput" in str(error)


@pytest.mark.parametrize("value", [None, "Where is my order?", ["m"], 5])
def test_check_5_original_input_must_be_an_object(value: Any) -> None:
    assert refused(wire_checkpoint(originalInput=value)).field == "originalInput"


@pytest.mark.parametrize("value", [{}, {"message": None}, {"message": 5}, {"text": "m"}])
def test_check_5_original_input_message_must_be_a_string(value: Any) -> None:
    error = refused(wire_checkpoint(originalInput=value))
    assert error.field == "originalInput.message"


def test_check_5_an_empty_original_message_is_still_a_string() -> None:
    # checkpoint() writes '' when the state has no userMessage ("The two writers").
    assert loads(wire_checkpoint(originalInput={"message": ""})).original_input == {"message": ""}


@pytest.mark.parametrize("value", [5, None, ["billing"], {"id": "billing"}, False])
def test_check_6_skill_cursor_must_be_a_string_and_null_is_refused(value: Any) -> None:
    assert refused(wire_checkpoint(skillCursor=value)).field == "skillCursor"


def test_check_6_a_string_skill_cursor_loads() -> None:
    assert loads(wire_checkpoint(skillCursor="billing")).skill_cursor == "billing"


@pytest.mark.parametrize(
    "value",
    [
        {"revisionSpent": True},
        {"revisionSpent": True, "pending": {"instruction": "Cite the tool result."}},
    ],
)
def test_check_7_evidence_recovery_shapes_that_load(value: dict[str, Any]) -> None:
    assert loads(wire_checkpoint(evidenceRecovery=value)).evidence_recovery == value


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (None, "evidenceRecovery"),
        ([{"revisionSpent": True}], "evidenceRecovery"),
        ("spent", "evidenceRecovery"),
        ({"revisionSpent": True, "budget": 1}, "evidenceRecovery"),
        ({}, "evidenceRecovery.revisionSpent"),
        ({"revisionSpent": False}, "evidenceRecovery.revisionSpent"),
        ({"revisionSpent": 1}, "evidenceRecovery.revisionSpent"),
        ({"revisionSpent": "true"}, "evidenceRecovery.revisionSpent"),
        ({"revisionSpent": True, "pending": None}, "evidenceRecovery.pending"),
        ({"revisionSpent": True, "pending": "redo"}, "evidenceRecovery.pending"),
        ({"revisionSpent": True, "pending": {}}, "evidenceRecovery.pending"),
        (
            {"revisionSpent": True, "pending": {"instruction": "x", "from": "checker"}},
            "evidenceRecovery.pending",
        ),
        ({"revisionSpent": True, "pending": {"instruction": ""}}, "evidenceRecovery.pending"),
        ({"revisionSpent": True, "pending": {"instruction": 5}}, "evidenceRecovery.pending"),
    ],
)
def test_check_7_evidence_recovery_shapes_that_are_refused(value: Any, field: str) -> None:
    error = refused(wire_checkpoint(evidenceRecovery=value))
    assert error.field.startswith(field), error.field
    assert error.field.startswith("evidenceRecovery")


def pending(instruction: str) -> dict[str, Any]:
    return wire_checkpoint(
        evidenceRecovery={"revisionSpent": True, "pending": {"instruction": instruction}}
    )


@pytest.mark.parametrize(
    "instruction",
    ["a" * 1_000_000, EMOJI * 500_000, "a" * 999_998 + EMOJI],
    ids=["1M-ascii", "500k-emoji", "999998-ascii+emoji"],
)
def test_check_7_an_instruction_of_exactly_one_million_utf16_units_loads(instruction: str) -> None:
    checkpoint = AgentRunCheckpoint.from_dict(pending(instruction))
    assert checkpoint.evidence_recovery is not None


@pytest.mark.parametrize(
    "instruction",
    ["a" * 1_000_001, EMOJI * 500_001, "a" * 999_999 + EMOJI],
    ids=["1M+1-ascii", "500001-emoji", "999999-ascii+emoji"],
)
def test_check_7_an_instruction_over_one_million_utf16_units_is_refused(instruction: str) -> None:
    # 500,001 emoji are 500,001 code points but 1,000,002 UTF-16 code units: counted as JS does.
    error = refused(pending(instruction))
    assert error.field == "evidenceRecovery.pending.instruction"
    assert "1000000" in str(error) or "1,000,000" in str(error)


def test_check_7_the_instruction_limit_holds_through_from_json() -> None:
    assert refused_json(orjson.dumps(pending(EMOJI * 500_001))).field.startswith(
        "evidenceRecovery.pending"
    )


BASIS_ROW = {
    "kind": "basis",
    "toolCallId": "call_1",
    "toolName": "lookup_order",
    "iteration": 1,
    "basis": "direct",
}
STANDING_ROW = {
    "kind": "standing",
    "toolCallId": "call_1",
    "standing": "fact",
    "assertions": ["Order A-17 has shipped"],
    "declaredOn": "answer",
    "iteration": 2,
}
CONFLICT_ROW = {
    "kind": "conflict",
    "key": "order:A-17:status",
    "witnesses": [
        {"toolCallId": "call_1", "subject": {"kind": "order", "id": "A-17"}, "predicate": "shipped"}
    ],
    "iteration": 2,
}


@pytest.mark.parametrize(
    "row",
    [
        BASIS_ROW,
        BASIS_ROW
        | {"expect": "high", "proposition": "p", "predicts": "q", "malformed": 0, "turn": 3},
        BASIS_ROW | {"basis": "exploratory"},
        STANDING_ROW,
        STANDING_ROW | {"standing": "noise", "assertions": []},
        STANDING_ROW
        | {
            "declaredOn": {"toolCallId": "call_2"},
            "toolName": "lookup_order",
            "ref": "r1",
            "sought": "s",
            "settles": "t",
            "line": 3,
            "unknownId": True,
        },
        CONFLICT_ROW,
        CONFLICT_ROW | {"turn": 2.0},
    ],
)
def test_check_8_ledger_rows_of_the_9101_kinds_load(row: dict[str, Any]) -> None:
    assert loads(wire_checkpoint(findingsLedger=[row])).findings_ledger == [row]


@pytest.mark.parametrize(
    "kind",
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
    ],
)
def test_check_8_ledger_kinds_of_later_builds_are_accepted(kind: str) -> None:
    row = {"kind": kind, "turn": 4, "payload": {"anything": ["the later build wrote"]}}
    assert loads(wire_checkpoint(findingsLedger=[row])).findings_ledger == [row]


@pytest.mark.parametrize("kind", ["hunch", "Basis", "", None, 3])
def test_check_8_an_unknown_or_missing_kind_is_refused(kind: Any) -> None:
    error = refused(wire_checkpoint(findingsLedger=[BASIS_ROW, {"kind": kind, "iteration": 1}]))
    assert error.field.startswith("findingsLedger[1]"), error.field


def test_check_8_a_row_without_kind_is_refused() -> None:
    error = refused(wire_checkpoint(findingsLedger=[drop(BASIS_ROW, "kind")]))
    assert error.field.startswith("findingsLedger[0]")


@pytest.mark.parametrize("kind", [["basis"], {"k": "basis"}])
def test_check_8_a_kind_that_is_not_even_hashable_is_a_format_error(kind: Any) -> None:
    # D6: never a bare TypeError from inside the validator.
    error = refused(wire_checkpoint(findingsLedger=[{"kind": kind}]))
    assert error.field.startswith("findingsLedger[0]")


@pytest.mark.parametrize("turn", ["3", None, True, [3], {"n": 3}])
def test_check_8_a_row_turn_must_be_a_number(turn: Any) -> None:
    error = refused(wire_checkpoint(findingsLedger=[BASIS_ROW | {"turn": turn}]))
    assert error.field == "findingsLedger[0].turn"


@pytest.mark.parametrize("ledger", [None, {"0": BASIS_ROW}, "[]", 0])
def test_check_8_the_ledger_must_be_a_list(ledger: Any) -> None:
    assert refused(wire_checkpoint(findingsLedger=ledger)).field == "findingsLedger"


@pytest.mark.parametrize("row", [None, "basis", [BASIS_ROW], 1])
def test_check_8_every_row_must_be_an_object(row: Any) -> None:
    assert refused(wire_checkpoint(findingsLedger=[row])).field == "findingsLedger[0]"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (drop(BASIS_ROW, "toolCallId"), "toolCallId"),
        (drop(BASIS_ROW, "toolName"), "toolName"),
        (BASIS_ROW | {"iteration": "1"}, "iteration"),
        (BASIS_ROW | {"basis": "hunch"}, "basis"),
        (BASIS_ROW | {"basis": ["direct"]}, "basis"),
        (BASIS_ROW | {"expect": "certain"}, "expect"),
        (BASIS_ROW | {"expect": ["low"]}, "expect"),
        (BASIS_ROW | {"proposition": 5}, "proposition"),
        (BASIS_ROW | {"malformed": "1"}, "malformed"),
        (drop(STANDING_ROW, "toolCallId"), "toolCallId"),
        (STANDING_ROW | {"standing": "maybe"}, "standing"),
        (STANDING_ROW | {"standing": {"is": "fact"}}, "standing"),
        (STANDING_ROW | {"assertions": "shipped"}, "assertions"),
        (STANDING_ROW | {"declaredOn": "question"}, "declaredOn"),
        (STANDING_ROW | {"declaredOn": {}}, "declaredOn"),
        (drop(STANDING_ROW, "iteration"), "iteration"),
        (STANDING_ROW | {"unknownId": False}, "unknownId"),
        (drop(CONFLICT_ROW, "key"), "key"),
        (CONFLICT_ROW | {"witnesses": "call_1"}, "witnesses"),
        (CONFLICT_ROW | {"witnesses": [{"toolCallId": "call_1"}]}, "witnesses[0]"),
        (CONFLICT_ROW | {"witnesses": [None]}, "witnesses[0]"),
        (drop(CONFLICT_ROW, "iteration"), "iteration"),
    ],
)
def test_check_8_each_kind_needs_its_fields(row: dict[str, Any], field: str) -> None:
    error = refused(wire_checkpoint(findingsLedger=[row]))
    assert error.field == f"findingsLedger[0].{field}"


@pytest.mark.parametrize("turn", [1, 2, 2**53 - 1, 7.0])
def test_check_9_turn_number_is_a_safe_integer_from_one(turn: Any) -> None:
    assert loads(wire_checkpoint(turnNumber=turn)).turn_number == turn


@pytest.mark.parametrize("turn", [0, -1, 1.5, 2**53, "2", True, None, [1]])
def test_check_9_other_turn_numbers_are_refused(turn: Any) -> None:
    assert refused(wire_checkpoint(turnNumber=turn)).field == "turnNumber"


def history_error(*messages: Any) -> CheckpointFormatError:
    return refused(wire_checkpoint(history=list(messages)))


def test_check_10_a_missing_content_is_named_at_its_index() -> None:
    # "Edge cases", item 2
    error = history_error({"role": "user"})
    assert error.field == "history[0]"
    assert "content" in str(error) and "missing" in str(error)


def test_check_10_a_null_message_is_called_null() -> None:
    error = history_error(None)
    assert error.field == "history[0]"
    assert "null" in str(error)


def test_check_10_the_index_is_the_first_bad_message() -> None:
    ok = {"role": "user", "content": "hi"}
    error = history_error(ok, ok, {"role": "assistant", "content": None}, None)
    assert error.field == "history[2]"
    assert "content" in str(error) and "null" in str(error)


def test_check_10_a_wrong_type_is_not_called_missing() -> None:
    error = history_error({"role": 5, "content": "hi"})
    assert error.field == "history[0]"
    assert "role" in str(error) and "number" in str(error)
    assert "missing" not in str(error)


def test_check_10_each_wrong_field_is_described() -> None:
    message = str(history_error({"content": ["hi"]}))
    assert "role is missing" in message
    assert "content is an array" in message


@pytest.mark.parametrize("message", ["user: hi", 5, ["user", "hi"], True])
def test_check_10_a_message_must_be_an_object(message: Any) -> None:
    error = history_error(message)
    assert error.field == "history[0]"
    assert "object" in str(error)


def test_check_10_role_is_only_checked_to_be_a_string() -> None:
    # The validator does not police the role enum ("Nested shapes"): a later build's
    # role still loads.
    checkpoint = loads(wire_checkpoint(history=[{"role": "developer", "content": ""}]))
    assert checkpoint.history == [{"role": "developer", "content": ""}]


def test_checks_run_in_the_order_of_the_spec() -> None:
    # Every check fails; fixing them one at a time must reveal them in the order of "Validation".
    broken: dict[str, Any] = {
        "version": 2,
        "runId": 5,
        "history": [None],
        "lastCompletedIteration": "0",
        "originalInput": {"message": None},
        "skillCursor": None,
        "evidenceRecovery": {"revisionSpent": False},
        "findingsLedger": [{"kind": "hunch"}],
        "turnNumber": 0,
    }
    fixes: list[tuple[str, str, Any]] = [
        ("version", "version", 1),
        ("runId", "runId", "run-1"),
        ("lastCompletedIteration", "lastCompletedIteration", 0),
        ("originalInput.message", "originalInput", {"message": "m"}),
        ("skillCursor", "skillCursor", "billing"),
        ("evidenceRecovery.revisionSpent", "evidenceRecovery", {"revisionSpent": True}),
        ("findingsLedger[0].kind", "findingsLedger", [{"kind": "clock"}]),
        ("turnNumber", "turnNumber", 1),
        ("history[0]", "history", [{"role": "user", "content": "m"}]),
    ]
    for expected_field, key, fixed in fixes:
        assert refused(broken).field == expected_field
        broken[key] = fixed
    assert loads(broken).turn_number == 1


# ---------------------------------------------------------------------------------------------
# what the validator does not check, and null as absent


def test_checkpointed_at_is_not_checked() -> None:
    assert loads(drop(wire_checkpoint(), "checkpointedAt")).checkpointed_at is None
    assert loads(wire_checkpoint(checkpointedAt="yesterday")).to_dict()["checkpointedAt"] == (
        "yesterday"
    )


@pytest.mark.parametrize("key", ["identity", "folded", "agent"])
def test_null_identity_folded_or_agent_reads_as_absent(key: str) -> None:
    checkpoint = loads(wire_checkpoint(**{key: None}))
    assert getattr(checkpoint, key) is None
    assert key not in checkpoint.to_dict()
    assert b"null" not in checkpoint.to_json()


def test_claim_verification_is_carried_verbatim() -> None:
    opaque = {"exact": {"call_1": [1, 2]}, "reservations": 3, "future": {"nested": [None, True]}}
    checkpoint = loads(wire_checkpoint(claimVerification=opaque))
    assert checkpoint.claim_verification == opaque
    assert checkpoint.to_dict()["claimVerification"] == opaque


def test_carried_fields_round_trip_unchanged() -> None:
    payload = wire_checkpoint(
        identity={"tenant": "acme", "principal": "user-42", "conversationId": "conv-001"},
        agent={"id": "support-agent"},
        skillCursor="billing",
        turnNumber=3,
        failurePoint={"iteration": 2, "phase": "llm", "stage": "call-llm"},
        folded=[
            {
                "summaryFingerprint": "1a2b3c",
                "runId": "run-1-1",
                "iteration": 1,
                "foldedAtMs": 1796000000000,
                "model": "mock-model",
                "messageCount": 0,
                "removedStageIds": [],
                "retained": "discard",
            }
        ],
    )
    checkpoint = loads(payload)
    assert checkpoint.to_dict() == payload
    assert checkpoint.failure_point == {"iteration": 2, "phase": "llm", "stage": "call-llm"}
    assert checkpoint.identity == payload["identity"]
    assert checkpoint.agent == {"id": "support-agent"}


# ---------------------------------------------------------------------------------------------
# D2: unknown keys are carried


def test_unknown_top_level_keys_are_accepted_and_written_back() -> None:
    # "Edge cases", item 3
    payload = wire_checkpoint(futureThing=1, nextGen={"spans": [1, 2], "note": None})
    checkpoint = loads(payload)
    assert checkpoint.to_dict() == payload
    assert orjson.loads(checkpoint.to_json()) == payload


def test_unknown_keys_inside_messages_are_carried() -> None:
    history = [
        {"role": "user", "content": "hi", "attachments": [{"kind": "image", "ref": "s3://b/k"}]},
        {
            "role": "assistant",
            "content": "",
            "toolCalls": [
                {
                    "id": "call_1",
                    "name": "lookup_order",
                    "args": {"orderId": "A-17"},
                    "providerMeta": {"thoughtSignature": "c2lnbmF0dXJl"},
                }
            ],
            "thinkingBlocks": [{"type": "thinking", "content": "...", "signature": "EqQBCkYI"}],
            "citations": None,
        },
    ]
    checkpoint = loads(wire_checkpoint(history=history))
    assert checkpoint.history == history
    assert checkpoint.to_dict()["history"] == history


# ---------------------------------------------------------------------------------------------
# "Serialization"


def test_a_checkpoint_with_nothing_optional_writes_only_the_required_keys() -> None:
    checkpoint = AgentRunCheckpoint(
        run_id="run-1-1",
        history=[{"role": "user", "content": "hi"}],
        last_completed_iteration=0,
        original_input={"message": "hi"},
        checkpointed_at=1796000000000,
    )
    assert set(checkpoint.to_dict()) == REQUIRED_KEYS
    assert b"null" not in checkpoint.to_json()
    assert orjson.loads(checkpoint.to_json()) == checkpoint.to_dict()


def test_to_dict_hands_out_a_deep_copy() -> None:
    checkpoint = loads(wire_checkpoint(identity={"conversationId": "c"}))
    wire = checkpoint.to_dict()
    wire["history"][0]["content"] = "tampered"
    wire["identity"]["conversationId"] = "other"
    again = checkpoint.to_dict()
    assert again["history"][0]["content"] == "Where is my order A-17?"
    assert again["identity"] == {"conversationId": "c"}


def test_from_dict_keeps_no_reference_to_the_callers_dict() -> None:
    payload = wire_checkpoint()
    checkpoint = AgentRunCheckpoint.from_dict(payload)
    payload["history"][0]["content"] = "tampered"
    payload["history"].append({"role": "user", "content": "more"})
    assert checkpoint.to_dict()["history"][0]["content"] == "Where is my order A-17?"
    assert len(checkpoint.history) == 2


def test_to_json_is_compact_orjson_bytes() -> None:
    checkpoint = loads(wire_checkpoint())
    data = checkpoint.to_json()
    assert isinstance(data, bytes)
    assert data == orjson.dumps(checkpoint.to_dict())


# ---------------------------------------------------------------------------------------------
# from_json / from_dict: what is not a checkpoint at all


@pytest.mark.parametrize(
    "data", [b"", b"{", b"not json", b'{"version": 1,}', b"\x00\x01", "{'version': 1}"]
)
def test_bytes_that_are_not_json_are_a_format_error(data: bytes | str) -> None:
    error = refused_json(data)
    assert error.field == "<checkpoint>"
    assert "JSON" in str(error)


@pytest.mark.parametrize(
    "data",
    [b'{"version": 1, "runId": "\xff\xfe"}', b"\xc3\x28", orjson.dumps(wire_checkpoint())[:-1]],
)
def test_bytes_that_are_not_utf8_or_truncated_are_a_format_error(data: bytes) -> None:
    error = refused_json(data)
    assert error.field == "<checkpoint>"


def test_invalid_utf8_is_called_invalid_utf8() -> None:
    data = orjson.dumps(wire_checkpoint()).replace(b"Where", b"Wh\xffre")
    assert "UTF-8" in str(refused_json(data))


@pytest.mark.parametrize("data", [None, 5, ["{}"], {"version": 1}])
def test_from_json_refuses_what_is_not_bytes_or_str(data: Any) -> None:
    assert refused_json(data).field == "<checkpoint>"


def test_a_very_large_garbage_payload_is_refused_by_name() -> None:
    assert refused_json(b"x" * 20_000_000).field == "<checkpoint>"


def test_very_large_valid_strings_load() -> None:
    big = "x" * 5_000_000
    payload = wire_checkpoint(runId=big, history=[{"role": "tool", "content": big}])
    checkpoint = AgentRunCheckpoint.from_json(orjson.dumps(payload))
    assert checkpoint.run_id == big
    assert checkpoint.to_dict() == payload


@pytest.mark.parametrize(
    ("fields", "field_start"),
    [
        ({"futureThing": {"a set"}}, "<checkpoint>"),
        ({"history": [{"role": "user", "content": "hi", "blob": object()}]}, "<checkpoint>"),
        ({"history": [{"role": "user", "content": "hi", 3: "int key"}]}, "<checkpoint>"),
        ({"history": [{"role": "user", "content": "bad \ud800 surrogate"}]}, "<checkpoint>"),
    ],
)
def test_from_dict_refuses_data_json_cannot_carry(fields: dict[str, Any], field_start: str) -> None:
    with pytest.raises(CheckpointFormatError) as caught:
        AgentRunCheckpoint.from_dict(wire_checkpoint(**fields))
    assert caught.value.field.startswith(field_start)


@pytest.mark.parametrize(
    "fields",
    [
        {"lastCompletedIteration": float("inf")},
        {"lastCompletedIteration": float("nan")},
        {"findingsLedger": [{"kind": "clock", "turn": float("inf")}]},
        {"history": [{"role": "user", "content": "hi", "score": float("nan")}]},
    ],
    ids=["lci-inf", "lci-nan", "turn-inf", "message-nan"],
)
def test_from_dict_never_accepts_a_number_json_cannot_write(fields: dict[str, Any]) -> None:
    # JSON has no Infinity or NaN: loading one either fails by name or survives the codec.
    try:
        checkpoint = AgentRunCheckpoint.from_dict(wire_checkpoint(**fields))
    except CheckpointFormatError:
        return
    assert AgentRunCheckpoint.from_json(checkpoint.to_json()) == checkpoint
    assert checkpoint.to_dict() == orjson.loads(checkpoint.to_json())


@pytest.mark.parametrize(
    "failure_point",
    [
        {"iteration": 1, "phase": ["llm"]},
        {"iteration": 1, "phase": {"name": "llm"}},
        {"iteration": 1, "phase": "llm", "stage": ["call-llm"]},
    ],
)
def test_an_odd_failure_point_never_escapes_as_a_bare_type_error(
    failure_point: dict[str, Any],
) -> None:
    # The validator need not check failurePoint ("Validation"), but D6: a load fails by name
    # or succeeds.
    try:
        checkpoint = AgentRunCheckpoint.from_dict(wire_checkpoint(failurePoint=failure_point))
    except CheckpointFormatError as error:
        assert error.field.startswith("failurePoint")
    else:
        assert checkpoint.failure_point == failure_point
