"""Pure parts of the job system: payloads, envelopes, namespaces (settings: test_settings.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent import AgentRunCheckpoint, CheckpointFormatError
from tasks.core.errors import BadPayload, TurnDeadLettered, UnreadableConversation
from tasks.core.namespaces import namespace_for
from tasks.core.payload import parse_payload, registration_of
from tasks.store.conversations import envelope_bytes, read_envelope

CHECKPOINT = {
    "version": 1,
    "runId": "run-1-1",
    "history": [{"role": "user", "content": "hi"}],
    "lastCompletedIteration": 1,
    "originalInput": {"message": "hi"},
    "futureKey": {"kept": True},
}


def test_payload_fills_the_identity_and_names_the_namespace() -> None:
    request = parse_payload(
        {"agent": "a", "conversation_id": "c/1", "message": "hi", "identity": {"tenant": "t_"}}
    )
    assert request.identity == {"tenant": "t_", "conversationId": "c/1"}
    assert request.namespace == "t_/_/c%2F1"
    assert parse_payload({"agent": "a", "conversation_id": "c", "message": "hi"}).identity is None


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"agent": "", "conversation_id": "c", "message": "m"}, "agent"),
        ({"agent": "a", "conversation_id": "", "message": "m"}, "conversation_id"),
        ({"agent": "a", "conversation_id": "c" * 600, "message": "m"}, "conversation_id"),
        ({"agent": "a", "conversation_id": "c", "message": "m", "identity": []}, "identity"),
        ([1, 2], "<payload>"),
    ],
)
def test_bad_payloads_name_their_field(payload: Any, field: str) -> None:
    with pytest.raises(BadPayload) as caught:
        parse_payload(payload)
    assert caught.value.field == field
    assert registration_of(payload)[2] == ""


def test_namespaces_keep_tenants_apart() -> None:
    assert namespace_for("c", {"tenant": "a"}) != namespace_for("c", {"tenant": "b"})
    assert namespace_for("c", None) == "_/_/c"
    assert namespace_for("c", {"tenant": "_"}) == "%5F/_/c"
    assert namespace_for("c", {"tenant": "a/b"}) != namespace_for(
        "c", {"tenant": "a", "principal": "b"}
    )


def test_envelope_round_trip_keeps_unknown_keys() -> None:
    checkpoint = AgentRunCheckpoint.from_dict(CHECKPOINT)
    raw = envelope_bytes(checkpoint, saved_at_ms=5)
    assert orjson.loads(raw) == {"format": "conversation-v1", "data": CHECKPOINT, "savedAt": 5}
    assert read_envelope(raw, "k", "_/_/c").to_dict() == CHECKPOINT


def test_unreadable_envelopes_are_refused_by_name() -> None:
    with pytest.raises(UnreadableConversation, match="not JSON"):
        read_envelope(b"\x00", "k", "n")
    with pytest.raises(UnreadableConversation, match="flowchart-v1"):
        read_envelope(b'{"format":"flowchart-v1","data":{}}', "k", "n")
    with pytest.raises(CheckpointFormatError, match="version"):
        read_envelope(b'{"format":"conversation-v1","data":{"version":3}}', "k", "n")


def test_turn_dead_lettered_survives_celerys_rebuild_from_args() -> None:
    original = TurnDeadLettered("dl-1", "poison", "it died")
    rebuilt = TurnDeadLettered(*original.args)
    assert (rebuilt.entry_id, rebuilt.reason) == ("dl-1", "poison")
    assert "agentjobs dlq show dl-1" in str(rebuilt)
