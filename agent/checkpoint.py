"""AgentRunCheckpoint v1: the value, its one validator, and the orjson codec.

Every door that loads a checkpoint (`from_json`, `from_dict`, `Agent.run(continue_from=...)`,
`Agent.resume_on_error`, the job system, the CLI) goes through `validate_checkpoint`, so a bad
checkpoint fails at the door with a `CheckpointFormatError` naming the field, never deep in a run.

The nested values (history messages, identity, ledger rows...) stay plain wire-shape data:
the runtime treats them as immutable and builds new dicts instead of editing them. Unknown keys,
top-level (kept in `extra`) and inside messages, are carried through unchanged
(docs/checkpoint.md, D2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson

from agent.errors import CheckpointFormatError
from agent.jsnumbers import EXACT_INT, needs_js_numbers, normalize_in_place

CHECKPOINT_VERSION = 1
# A checkpoint larger than this is refused before parsing: it is not a conversation, it is an
# accident (or an attack) that would pin a worker's memory.
MAX_CHECKPOINT_BYTES = 256 * 1024 * 1024
MAX_INSTRUCTION_UTF16_UNITS = 1_000_000
_MAX_SAFE_INTEGER = 2**53 - 1
# What from_json reads (a tuple: `isinstance` with a union builds the union on every call).
_JSON_TEXT = (bytes, bytearray, memoryview, str)

# Wire key -> attribute, in the order the writers emit them (the reference runtime's order).
_KNOWN_KEYS: dict[str, str] = {
    "version": "version",
    "runId": "run_id",
    "history": "history",
    "lastCompletedIteration": "last_completed_iteration",
    "originalInput": "original_input",
    "checkpointedAt": "checkpointed_at",
    "failurePoint": "failure_point",
    "folded": "folded",
    "findingsLedger": "findings_ledger",
    "claimVerification": "claim_verification",
    "turnNumber": "turn_number",
    "evidenceRecovery": "evidence_recovery",
    "identity": "identity",
    "skillCursor": "skill_cursor",
    "agent": "agent",
}
# Optional keys where a JSON null means "absent" (the reference leaks null identities as
# "explicit"; we read them as absent). Any other optional key refuses null.
_NULL_MEANS_ABSENT = frozenset(
    {"checkpointedAt", "failurePoint", "folded", "claimVerification", "identity", "agent"}
)

_FAILURE_PHASES = frozenset({"iteration", "tool", "llm", "unknown"})
_LATER_LEDGER_KINDS = frozenset(
    {
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
    }
)
_BASIS = frozenset({"direct", "exploratory"})
_EXPECT = frozenset({"low", "medium", "high"})
_STANDING = frozenset({"fact", "open", "noise", "ruled-out"})


def _is_number(value: object) -> bool:
    # NaN and the infinities are floats but not JSON numbers.
    return type(value) is int or (type(value) is float and math.isfinite(value))


def _is_object(value: object) -> TypeGuard[Mapping[str, Any]]:
    # A dict (what orjson makes) is checked without the slower ABC test.
    return type(value) is dict or isinstance(value, Mapping)


def _one_of(value: object, options: frozenset[str]) -> bool:
    # Membership on a frozenset hashes the value: a list or dict must fail the check, not raise.
    return isinstance(value, str) and value in options


def _is_int(value: object) -> bool:
    if type(value) is int:
        return True
    return type(value) is float and value.is_integer()


def utf16_units(text: str) -> int:
    """Length as JavaScript counts it: characters outside the BMP take two code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _describe(value: object) -> str:
    """A type name for error messages; never the value itself (it may be private)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _fail(field_name: str, problem: str) -> CheckpointFormatError:
    return CheckpointFormatError(field_name, problem)


# ---------------------------------------------------------------------------------------------
# the validator


def validate_checkpoint(value: object) -> None:
    """Raise CheckpointFormatError naming the first field that is wrong
    (docs/checkpoint.md, "Validation")."""
    _validate(value)


def _validate(value: object) -> bool:
    """validate_checkpoint, and whether a number in the value is not written as the reference
    writes it (found in the same pass over history, so loading walks history once)."""
    if not _is_object(value):
        raise _fail("<checkpoint>", f"not an object (got {_describe(value)})")
    version = value.get("version")
    if type(version) not in (int, float) or version != CHECKPOINT_VERSION:
        shown = "missing" if "version" not in value else repr(version)[:40]
        raise _fail("version", f"unsupported checkpoint version: {shown} (this runtime reads 1)")
    run_id, history = value.get("runId"), value.get("history")
    if not isinstance(run_id, str) or not isinstance(history, list):
        raise _fail(
            "runId" if not isinstance(run_id, str) else "history",
            "runId (a string) and history (an array) are both required; got runId "
            f"{_describe(run_id)}, history {_describe(history)}",
        )
    if not _is_number(value.get("lastCompletedIteration")):
        raise _fail(
            "lastCompletedIteration",
            f"must be a number, got {_describe(value.get('lastCompletedIteration'))}",
        )
    original = value.get("originalInput")
    if not _is_object(original):
        raise _fail("originalInput", f"required object, got {_describe(original)}")
    if not isinstance(original.get("message"), str):
        raise _fail(
            "originalInput.message", f"must be a string, got {_describe(original.get('message'))}"
        )
    if "skillCursor" in value and not isinstance(value["skillCursor"], str):
        raise _fail("skillCursor", f"must be a string, got {_describe(value['skillCursor'])}")
    if "evidenceRecovery" in value:
        _check_evidence_recovery(value["evidenceRecovery"])
    if "findingsLedger" in value:
        _check_ledger(value["findingsLedger"])
    if "turnNumber" in value:
        turn = value["turnNumber"]
        if not _is_int(turn) or not 1 <= turn <= _MAX_SAFE_INTEGER:
            raise _fail("turnNumber", f"must be a safe integer >= 1, got {_describe(turn)}")
    renumber = _check_history(history)
    _check_carried_shapes(value)
    return renumber or _renumber_top_level(value)


def _renumber_top_level(value: Mapping[str, Any]) -> bool:
    for key, item in value.items():
        kind = type(item)
        if kind is str or key == "history" or (kind is int and -EXACT_INT <= item <= EXACT_INT):
            continue
        if needs_js_numbers(item):
            return True
    return False


def _check_history(history: list[Any]) -> bool:
    """Refuse a bad message by index; True when a number in history needs renumbering."""
    renumber = _scan_history(history)
    if renumber is not None:
        return renumber
    for index, message in enumerate(history):
        where = f"history[{index}]"
        if message is None:
            raise _fail(where, "is null; every message must be an object with role and content")
        if not _is_object(message):
            raise _fail(where, f"must be an object, got {_describe(message)}")
        problems = [
            f"{key} is missing" if key not in message else f"{key} is {_describe(message[key])}"
            for key in ("role", "content")
            if not isinstance(message.get(key), str)
        ]
        if problems:
            raise _fail(where, "; ".join(problems) + " (role and content must be strings)")
    return needs_js_numbers(history)


def _scan_history(history: list[Any]) -> bool | None:
    """The hot path of every load: whether a number in history needs renumbering, or None when a
    message is not a dict with string role and content (the caller then explains, or accepts
    other mappings and str subclasses). A few type tests per message, all inline (a call costs
    more than the tests): the usual shapes (text, tool result, tool calls whose args are strings,
    booleans or safe integers) are known to hold no number to rewrite without walking them; any
    other message is walked."""
    renumber = False
    for message in history:
        try:
            if (
                type(message) is not dict
                or type(message["role"]) is not str
                or type(message["content"]) is not str
            ):
                return None
        except KeyError:
            return None
        size = len(message)
        if size == 2:
            continue
        if renumber:
            continue  # decided; the rest is only checked
        try:  # a shape test that finds a key missing: another shape, walked below
            if size == 4:
                if type(message["toolCallId"]) is str and type(message["toolName"]) is str:
                    continue
            elif size == 3:
                calls = message["toolCalls"]
                if type(calls) is list:
                    for call in calls:
                        if type(call) is not dict or len(call) != 3:
                            break
                        args = call["args"]
                        if (
                            type(args) is not dict
                            or type(call["id"]) is not str
                            or type(call["name"]) is not str
                        ):
                            break
                        for item in args.values():
                            kind = type(item)
                            if (
                                kind is not str
                                and kind is not bool
                                and (kind is not int or not -EXACT_INT <= item <= EXACT_INT)
                            ):
                                break
                        else:
                            continue  # this call holds no number to rewrite
                        break
                    else:
                        continue  # no call does
        except KeyError:
            pass
        renumber = needs_js_numbers(message)
    return renumber


def _check_evidence_recovery(value: object) -> None:
    name = "evidenceRecovery"
    if not _is_object(value):
        raise _fail(name, f"must be an object, got {_describe(value)}")
    unknown = sorted(set(value) - {"revisionSpent", "pending"})
    if unknown:
        raise _fail(name, f"unknown keys {unknown}; allowed: revisionSpent, pending")
    if value.get("revisionSpent") is not True:
        raise _fail(f"{name}.revisionSpent", "must be true")
    if "pending" in value:
        pending = value["pending"]
        if not _is_object(pending) or set(pending) != {"instruction"}:
            raise _fail(f"{name}.pending", "must be an object whose only key is instruction")
        instruction = pending["instruction"]
        if not isinstance(instruction, str) or not instruction:
            raise _fail(f"{name}.pending.instruction", "must be a non-empty string")
        if utf16_units(instruction) > MAX_INSTRUCTION_UTF16_UNITS:
            raise _fail(
                f"{name}.pending.instruction",
                f"is longer than {MAX_INSTRUCTION_UTF16_UNITS} UTF-16 code units",
            )


def _check_ledger(rows: object) -> None:
    if not isinstance(rows, list):
        raise _fail("findingsLedger", f"must be an array, got {_describe(rows)}")
    for index, row in enumerate(rows):
        where = f"findingsLedger[{index}]"
        if not _is_object(row):
            raise _fail(where, f"must be an object, got {_describe(row)}")
        if "turn" in row and not _is_number(row["turn"]):
            raise _fail(f"{where}.turn", f"must be a number, got {_describe(row['turn'])}")
        kind = row.get("kind")
        if kind == "basis":
            _check_basis(where, row)
        elif kind == "standing":
            _check_standing(where, row)
        elif kind == "conflict":
            _check_conflict(where, row)
        elif not _one_of(kind, _LATER_LEDGER_KINDS):
            shown = repr(kind)[:60] if isinstance(kind, str) else _describe(kind)
            raise _fail(f"{where}.kind", f"unknown ledger row kind {shown}")


def _require(where: str, row: Mapping[str, Any], key: str, ok: bool, wanted: str) -> None:
    if not ok:
        state = "missing" if key not in row else _describe(row[key])
        raise _fail(f"{where}.{key}", f"must be {wanted}, got {state}")


def _check_basis(where: str, row: Mapping[str, Any]) -> None:
    _require(where, row, "toolCallId", isinstance(row.get("toolCallId"), str), "a string")
    _require(where, row, "toolName", isinstance(row.get("toolName"), str), "a string")
    _require(where, row, "iteration", _is_number(row.get("iteration")), "a number")
    _require(where, row, "basis", _one_of(row.get("basis"), _BASIS), "direct or exploratory")
    if "expect" in row:
        _require(where, row, "expect", _one_of(row["expect"], _EXPECT), "low, medium or high")
    for key in ("proposition", "predicts"):
        if key in row:
            _require(where, row, key, isinstance(row[key], str), "a string")
    if "malformed" in row:
        _require(where, row, "malformed", _is_int(row["malformed"]), "an integer")


def _check_standing(where: str, row: Mapping[str, Any]) -> None:
    _require(where, row, "toolCallId", isinstance(row.get("toolCallId"), str), "a string")
    _require(
        where,
        row,
        "standing",
        _one_of(row.get("standing"), _STANDING),
        "fact, open, noise or ruled-out",
    )
    _require(where, row, "assertions", isinstance(row.get("assertions"), list), "an array")
    declared = row.get("declaredOn")
    declared_ok = declared == "answer" or (
        _is_object(declared) and isinstance(declared.get("toolCallId"), str)
    )
    _require(where, row, "declaredOn", declared_ok, "'answer' or {toolCallId}")
    _require(where, row, "iteration", _is_number(row.get("iteration")), "a number")
    if "toolName" in row:
        _require(where, row, "toolName", isinstance(row["toolName"], str), "a string")
    if "unknownId" in row:
        _require(where, row, "unknownId", row["unknownId"] is True, "true")


def _check_conflict(where: str, row: Mapping[str, Any]) -> None:
    _require(where, row, "key", isinstance(row.get("key"), str), "a string")
    witnesses = row.get("witnesses")
    _require(where, row, "witnesses", isinstance(witnesses, list), "an array")
    assert isinstance(witnesses, list)
    for index, witness in enumerate(witnesses):
        subject = witness.get("subject") if _is_object(witness) else None
        if not (
            _is_object(witness)
            and isinstance(witness.get("toolCallId"), str)
            and _is_object(subject)
            and "kind" in subject
            and "id" in subject
            and "predicate" in witness
        ):
            raise _fail(
                f"{where}.witnesses[{index}]", "must be {toolCallId, subject:{kind,id}, predicate}"
            )
    _require(where, row, "iteration", _is_number(row.get("iteration")), "a number")


def _check_carried_shapes(value: Mapping[str, Any]) -> None:
    """Shapes the reference does not check but a run would trip over later (D6): an identity,
    agent, folded list or failurePoint of the wrong type fails here, by name."""
    identity = value.get("identity")
    if identity is not None:
        if not _is_object(identity):
            raise _fail("identity", f"must be an object, got {_describe(identity)}")
        for key in ("tenant", "principal", "conversationId"):
            if identity.get(key) is not None and not isinstance(identity[key], str):
                raise _fail(f"identity.{key}", f"must be a string, got {_describe(identity[key])}")
    agent = value.get("agent")
    if agent is not None and not (_is_object(agent) and isinstance(agent.get("id"), str)):
        raise _fail("agent", "must be an object {id: string}")
    folded = value.get("folded")
    if folded is not None:
        if not isinstance(folded, list):
            raise _fail("folded", f"must be an array, got {_describe(folded)}")
        for index, span in enumerate(folded):
            if not _is_object(span):
                raise _fail(f"folded[{index}]", f"must be an object, got {_describe(span)}")
            if "messages" in span and not isinstance(span["messages"], list):
                raise _fail(f"folded[{index}].messages", "must be an array")
    failure = value.get("failurePoint")
    if failure is not None and not (
        _is_object(failure) and _one_of(failure.get("phase"), _FAILURE_PHASES)
    ):
        raise _fail("failurePoint", "must be an object {iteration, phase, stage?}")
    claims = value.get("claimVerification")
    if claims is not None and not _is_object(claims):
        raise _fail("claimVerification", f"must be an object, got {_describe(claims)}")


# ---------------------------------------------------------------------------------------------
# the value


def _wire_property(key: str, doc: str) -> property:
    def read(self: AgentRunCheckpoint) -> Any:
        return self._wire.get(key)

    return property(read, doc=doc)


class AgentRunCheckpoint:
    """One conversation (or one failed run of it), as the AgentRunCheckpoint v1 wire format.

    Immutable. It holds the validated wire dict itself, so loading adds one validation pass to
    orjson and writing is one orjson call; the attributes read that dict (absent keys read as
    None). Nested data is shared and must not be edited; `to_dict()` hands out a deep copy.
    Keys keep the order they were read in, so a checkpoint read and written again is the same
    JSON; checkpoints built here use the reference runtime's order. Numbers are written as the
    reference writes them (agent/jsnumbers.py): loading normalises them, and the constructor
    takes values already in that form (the runtime's are); build from plain data with
    `from_dict`.
    """

    __slots__ = ("_wire",)
    _wire: dict[str, Any]

    def __init__(
        self,
        *,
        run_id: str,
        history: list[dict[str, Any]],
        last_completed_iteration: int | float,
        original_input: dict[str, Any],
        checkpointed_at: int | float | None = None,
        failure_point: dict[str, Any] | None = None,
        folded: list[dict[str, Any]] | None = None,
        findings_ledger: list[dict[str, Any]] | None = None,
        claim_verification: dict[str, Any] | None = None,
        turn_number: int | None = None,
        evidence_recovery: dict[str, Any] | None = None,
        identity: dict[str, Any] | None = None,
        skill_cursor: str | None = None,
        agent: dict[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        version: int = CHECKPOINT_VERSION,
    ) -> None:
        values = locals()
        wire = {key: values[attr] for key, attr in _KNOWN_KEYS.items() if values[attr] is not None}
        for key, item in (extra or {}).items():
            wire.setdefault(key, item)
        object.__setattr__(self, "_wire", wire)

    version = _wire_property("version", "Always 1.")
    run_id = _wire_property("runId", "The run that wrote it; never reused.")
    history = _wire_property("history", "The conversation: wire-shape message dicts.")
    last_completed_iteration = _wire_property("lastCompletedIteration", "Diagnostic.")
    original_input = _wire_property("originalInput", "{message}: the turn's message.")
    checkpointed_at = _wire_property("checkpointedAt", "Epoch ms; diagnostic.")
    failure_point = _wire_property("failurePoint", "{iteration, phase, stage?}: crashes only.")
    folded = _wire_property("folded", "Folded spans, oldest first.")
    findings_ledger = _wire_property("findingsLedger", "Ledger rows.")
    claim_verification = _wire_property("claimVerification", "Opaque; carried verbatim.")
    turn_number = _wire_property("turnNumber", "The turn the history ends on.")
    evidence_recovery = _wire_property("evidenceRecovery", "{revisionSpent, pending?}.")
    identity = _wire_property("identity", "The caller-explicit identity.")
    skill_cursor = _wire_property("skillCursor", "The skill graph cursor.")
    agent = _wire_property("agent", "{id}: only when the recording agent was named.")

    @property
    def extra(self) -> dict[str, Any]:
        """Top-level keys this runtime does not know, written back unchanged (D2)."""
        return {k: v for k, v in self._wire.items() if k not in _KNOWN_KEYS}

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"AgentRunCheckpoint is immutable (cannot set {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentRunCheckpoint):
            return NotImplemented
        # A number held as an orjson.Fragment (jsnumbers) only compares by identity: the bytes
        # settle it then.
        return self._wire == other._wire or self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"AgentRunCheckpoint(run_id={self.run_id!r}, messages={len(self.history)}, "
            f"keys={list(self._wire)})"
        )

    # -- decoding ---------------------------------------------------------------------------

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> AgentRunCheckpoint:
        if not isinstance(data, _JSON_TEXT):
            raise _fail("<checkpoint>", f"expected JSON bytes or str, got {_describe(data)}")
        if len(data) > MAX_CHECKPOINT_BYTES:
            raise _fail("<checkpoint>", f"larger than {MAX_CHECKPOINT_BYTES} bytes")
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _fail("<checkpoint>", _why_not_json(data, exc)) from None
        return cls._wrap(value, _validate(value))

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> AgentRunCheckpoint:
        renumber = _validate(value)
        try:
            # A deep copy through the codec: the caller keeps their dict, and anything that is not
            # plain JSON (sets, objects, non-string keys) is refused here rather than at write time.
            owned = orjson.loads(orjson.dumps(value, option=_STRICT_DUMPS))
        except TypeError as exc:
            raise _fail("<checkpoint>", f"not plain JSON data: {exc}") from None
        return cls._wrap(owned, renumber)

    @classmethod
    def from_parsed(cls, value: Any) -> AgentRunCheckpoint:
        """Validate freshly parsed JSON that nobody else holds (no copy is made)."""
        return cls._wrap(value, _validate(value))

    @classmethod
    def _wrap(cls, value: dict[str, Any], renumber: bool) -> AgentRunCheckpoint:
        if renumber:
            # Written with floats (2.0, -0.0, 1e-6...): from now on as the reference writes them.
            normalize_in_place(value)
        for key in _NULL_MEANS_ABSENT:  # a loop, not any(...): a generator costs more
            if value.get(key, 0) is None:
                value = {
                    k: v for k, v in value.items() if v is not None or k not in _NULL_MEANS_ABSENT
                }
                break
        checkpoint = object.__new__(cls)
        object.__setattr__(checkpoint, "_wire", value)
        return checkpoint

    # -- encoding ---------------------------------------------------------------------------

    def wire(self) -> dict[str, Any]:
        """The wire dict itself, shared with this value: read it, never edit it (see to_dict)."""
        return self._wire

    def to_dict(self) -> dict[str, Any]:
        """The exact camelCase wire shape as a fresh deep copy; absent keys are absent."""
        result: dict[str, Any] = orjson.loads(orjson.dumps(self._wire))
        return result

    def to_json(self) -> bytes:
        return orjson.dumps(self._wire)


_STRICT_DUMPS = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _why_not_json(data: bytes | bytearray | memoryview | str, exc: Exception) -> str:
    if not isinstance(data, str):
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as bad:
            return f"not valid UTF-8 (byte {bad.start}); a checkpoint is UTF-8 JSON"
    return f"not valid JSON: {exc}"


def checkpoint_from_any(value: object) -> AgentRunCheckpoint:
    """The door used by Agent and the job system: a checkpoint, a dict, or JSON bytes/str."""
    if isinstance(value, AgentRunCheckpoint):
        return value
    if isinstance(value, bytes | bytearray | memoryview | str):
        return AgentRunCheckpoint.from_json(value)
    if isinstance(value, Mapping):
        return AgentRunCheckpoint.from_dict(value)
    raise _fail("<checkpoint>", f"not an object (got {_describe(value)})")
