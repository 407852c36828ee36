"""The state store's scripts agree with tasks/core/schema.py, the one place that names the turn
states, event types, record fields, replies and each script's KEYS and ARGV: the Lua files
spell none of them as strings or positions, every name they use is the schema's (and, for KEYS
and ARGV, the script's own), every script has an entry and every entry a script, each prelude
compiles in Redis, and the Python call sites hand each script the keys its names stand for."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import redis

import tasks
from tasks.core import schema
from tasks.core.keys import Keys, ShardKeys
from tasks.core.schema import SchemaMismatch, ScriptSchema, TurnState
from tasks.store import records as records_module
from tasks.store.records import TurnRecords, _source
from tasks.testing import RedisServer

LUA = resources.files("tasks.store") / "lua"
SCRIPT_NAMES = sorted(schema.SCRIPTS)
# The tables a script's own prelude defines; common.lua, shared by every script, uses none.
OWN_TABLES = {"R", "K", "A", "REST"}


def lua_text(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def lua_files() -> list[str]:
    return sorted(p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua"))


def references(text: str) -> Iterator[tuple[str, str | None]]:
    """(table, name or None) for each use of a schema table in the code of `text`."""
    for match in schema.LUA_REFERENCE.finditer(schema.lua_code(text)):
        yield match.group(1), match.group(2)


def schema_values() -> dict[str, str]:
    """Every string the schema names, with what it is, for the literal check."""
    values: dict[str, str] = {}
    for table, entries in schema.LUA_TABLES.items():
        for name, value in entries.items():
            values.setdefault(value, f"{table}.{name}")
    for script in schema.SCRIPTS.values():
        for member in script.replies or ():
            if isinstance(member.value, str):
                values.setdefault(member.value, f"{script.name}.lua's R.{member.name}")
    return values


# -- the files and the schema --------------------------------------------------------------------


def test_every_script_has_a_schema_entry_and_every_entry_a_script() -> None:
    assert set(lua_files()) - {"common"} == set(schema.SCRIPTS)
    for name, script in schema.SCRIPTS.items():
        assert script.name == name


@pytest.mark.parametrize("name", ["common", *SCRIPT_NAMES])
def test_no_script_spells_a_schema_value_as_a_string(name: str) -> None:
    values = schema_values()
    spelled = {text: values[text] for text in schema.lua_strings(lua_text(name)) if text in values}
    assert spelled == {}, f"{name}.lua spells these instead of naming them: {spelled}"


@pytest.mark.parametrize("name", ["common", *SCRIPT_NAMES])
def test_no_script_reads_keys_or_argv_by_position(name: str) -> None:
    text = lua_text(name)
    assert "KEYS" not in schema.lua_code(text), f"{name}.lua reads KEYS: use K.<name>"
    code = schema.lua_code(text)
    by_number = re.findall(r"ARGV\s*\[\s*\d|unpack\(\s*ARGV\s*,\s*\d|#ARGV\s*[<>=~]+\s*\d", code)
    assert by_number == [], f"{name}.lua reads ARGV by number: use A.<name> or REST"


@pytest.mark.parametrize("name", ["common", *SCRIPT_NAMES])
def test_no_script_defines_or_changes_a_schema_table(name: str) -> None:
    code = schema.lua_code(lua_text(name))
    tables = "|".join([*schema.LUA_TABLES, *OWN_TABLES, schema.TERMINAL_TABLE])
    assert not re.search(rf"\blocal\s+({tables})\b", code), f"{name}.lua shadows a table"
    assigned = re.search(rf"(?<![\w.])({tables})(\s*\.\s*\w+|\s*\[[^]]*\])?\s*=(?!=)", code)
    assert assigned is None, f"{name}.lua writes to {assigned.group(0) if assigned else ''}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_name_a_script_uses_is_in_the_schema(name: str) -> None:
    script = schema.SCRIPTS[name]
    own: dict[str, set[str]] = {
        "K": set(script.keys),
        "A": set(script.args + script.optional),
        "R": {member.name for member in script.replies or ()},
    }
    for text in (lua_text("common"), lua_text(name)):
        for table, used in references(text):
            if table in schema.LUA_TABLES:
                assert used in schema.LUA_TABLES[table], f"{name}.lua: {table}.{used}"
            elif table in own and used is not None:
                assert used in own[table], f"{name}.lua: {table}.{used} is not this script's"
            elif table == "REST":
                assert script.rest, f"{name}.lua uses REST but takes nothing after {script.args}"
            else:
                assert used is None, f"{name}.lua: {table}.{used}"


def test_common_lua_uses_no_tables_of_one_script() -> None:
    used = {table for table, _ in references(lua_text("common"))}
    assert used & OWN_TABLES == set()
    # end_turn's keys come as its parameter `k`: the names it reads are the ending keys.
    end_turn = schema.lua_code(lua_text("common")).split("local function end_turn", 1)[1]
    assert set(re.findall(r"(?<![\w.])k\.(\w+)", end_turn)) == set(schema.ENDING_KEYS)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_that_ends_a_turn_takes_the_ending_keys_first(name: str) -> None:
    script = schema.SCRIPTS[name]
    if "end_turn(" in schema.lua_code(lua_text(name)):
        assert script.keys[: len(schema.ENDING_KEYS)] == schema.ENDING_KEYS


# -- the states ----------------------------------------------------------------------------------


def test_the_python_turn_state_is_the_schemas() -> None:
    assert records_module.TurnState is TurnState
    assert tasks.TurnState is TurnState
    assert records_module.ClaimStatus is schema.ClaimStatus
    assert records_module.Registered is schema.Registered
    # Public values (docs/operations.md, "Turn states and status"): never to change.
    assert {s.name: s.value for s in TurnState} == {
        "QUEUED": "queued",
        "RUNNING": "running",
        "WAITING": "waiting",
        "PAUSED": "paused",
        "SUCCEEDED": "succeeded",
        "DEAD_LETTERED": "dead_lettered",
        "CANCELLED": "cancelled",
    }
    assert {s for s in TurnState if s.terminal} == schema.TERMINAL_STATES
    assert {"succeeded", "dead_lettered", "cancelled"} == schema.TERMINAL_STATES
    assert schema.LUA_TABLES["STATE"] == {s.name: s.value for s in TurnState}
    assert {str(e).split(".")[1] for e in schema.TERMINAL_EVENTS} == set(schema.TERMINAL_STATES)


# -- the prelude ---------------------------------------------------------------------------------


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushdb()
    yield connection
    connection.close()


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_compiles_with_its_prelude_and_its_text_is_stable(
    name: str, client: redis.Redis
) -> None:
    text = _source(name)
    code = schema.lua_common(lua_text("common"), lua_text(name)) + "\n" + lua_text(name)
    assert text == schema.lua_prelude(schema.SCRIPTS[name], code) + code
    # SCRIPT LOAD compiles it: a syntax error, a name used before its local, too many locals.
    assert client.script_load(text)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_carries_every_function_of_common_lua_it_calls(name: str) -> None:
    functions = set(re.findall(r"^local function (\w+)\(", lua_text("common"), re.M))
    code = schema.lua_code(_source(name))
    defined = set(re.findall(r"^local function (\w+)\(", code, re.M))
    called = {f for f in functions if re.search(rf"(?<![\w.:]){f}\s*\(", code)}
    assert called <= defined, f"{name}.lua calls {sorted(called - defined)} without them"
    # and none it does not call: each call builds only what it can use
    assert defined <= called


def test_common_lua_holds_nothing_but_functions() -> None:
    schema.lua_common(lua_text("common"), "")
    for stray in ("local x = 1\n", "-- ok\nlocal function f()\nend\nx = 1\n"):
        with pytest.raises(SchemaMismatch):
            schema.lua_common("-- head\n\n" + stray, "f()")


def test_the_lua_terminal_set_is_the_schemas(client: redis.Redis) -> None:
    probe = ScriptSchema("probe", keys=())
    body = lua_text("common") + (
        "\nlocal out = {}\n"
        "for _, state in ipairs(ARGV) do if is_terminal(state) then out[#out + 1] = state end end\n"
        "return out\n"
    )
    lua = schema.lua_prelude(probe, body) + body
    found: Any = client.eval(lua, 0, *TurnState, "", "nonsense")
    assert {state.decode() for state in found} == schema.TERMINAL_STATES


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        ("return F.no_such_field", "F.no_such_field"),
        ("return STATE.ASLEEP", "STATE.ASLEEP"),
        ("return EVENT.TURN_EXPLODED", "EVENT.TURN_EXPLODED"),
        ("return K.nowhere", "K.nowhere"),
        ("return A.nothing", "A.nothing"),
        ("return R.MAYBE", "R.MAYBE"),
        ("return F", "other than as F.<name>"),
        ("return STATE[x]", "other than as STATE.<name>"),
        ("return REST", "takes no ARGV after"),
        ("return TERMINAL.x", "has no names"),
    ],
)
def test_the_prelude_refuses_a_name_the_schema_does_not_have(code: str, problem: str) -> None:
    with pytest.raises(SchemaMismatch, match=re.escape(problem)):
        schema.lua_prelude(schema.CLAIM, code)


def test_the_prelude_holds_only_the_shared_names_a_script_uses() -> None:
    prelude = schema.lua_prelude(schema.TRACE, "-- F.agent in a comment\nreturn F.trace, 'F.x'")
    assert 'local F = {trace = "trace"}' in prelude
    assert "local K = {turn = KEYS[1], lease = KEYS[2]}" in prelude
    assert "local A = {turn_id = ARGV[1], token = ARGV[2], trace = ARGV[3]}" in prelude
    assert "EVENT" not in prelude and "REST" not in prelude


# -- KEYS and ARGV by name -----------------------------------------------------------------------


def test_keys_come_in_the_schemas_order_and_every_name_is_needed() -> None:
    named = {"lease": "L", "turn": "T"}
    assert schema.TRACE.keys_from(named) == ["T", "L"]
    with pytest.raises(SchemaMismatch, match=r"missing \['lease'\]"):
        schema.TRACE.keys_from({"turn": "T"})
    with pytest.raises(SchemaMismatch, match=r"unexpected \['queue'\]"):
        schema.TRACE.keys_from({**named, "queue": "Q"})


def test_arguments_come_in_order_optional_ones_all_or_none_then_the_rest() -> None:
    base = {"lease_ms": 5, "token": "tok", "turn_id": "t1"}
    assert schema.PROGRESS.args_from(base) == ["t1", "tok", 5]
    frame = {"frame": b"f", "iteration": 2, "ends_iteration": 1}
    assert schema.PROGRESS.args_from({**base, **frame}) == ["t1", "tok", 5, b"f", 2, 1]
    with pytest.raises(SchemaMismatch, match="missing"):
        schema.PROGRESS.args_from({**base, "frame": b"f"})
    trace = {"turn_id": "t1", "token": "tok", "trace": "{}"}
    with pytest.raises(SchemaMismatch, match="takes no ARGV after"):
        schema.TRACE.args_from(trace, ["extra"])
    journal = {"turn_id": "t1", "token": "tok", "event_type": "", "event_data": b"{}"}
    assert schema.JOURNAL.args_from(journal, ["f", b"v"]) == ["t1", "tok", "", b"{}", "f", b"v"]


PREFIX = "schematest"
NS = "_/_/c-1"


class RecordedRecords(TurnRecords):
    """TurnRecords whose script calls are kept: the script, its KEYS and its ARGV."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client, Keys(PREFIX, 4))
        self.calls: list[tuple[str, list[str], list[Any]]] = []

    def script(self, name: str) -> Any:
        inner = super().script(name)

        def call(keys: list[str], args: list[Any]) -> Any:
            self.calls.append((name, list(keys), list(args)))
            return inner(keys=keys, args=args)

        return call


def every_script(records: TurnRecords) -> None:
    """Each TurnRecords method that runs a script, once at least."""
    k = records.keys.for_namespace(NS)
    payload = b'{"agent":"demo","conversation_id":"c-1","message":"hi"}'

    def register(turn_id: str) -> None:
        records.register(
            turn_id, payload=payload, agent="demo", conversation_id="c-1", namespace=NS
        )

    for turn_id in ("t1", "t2", "t3"):
        register(turn_id)
    records.unregister("t3", NS)
    assert records.claim("t1", NS, "tok-a", 30, "w1").status is schema.ClaimStatus.CLAIMED
    assert records.keep_trace("t1", NS, "tok-a", '{"traceparent":"x"}')
    assert records.write_journal(
        "t1", NS, "tok-a", {"journal:response": b"{}"}, event_type="tool.started"
    )
    assert records.renew("t1", NS, "tok-a", 30)
    assert records.renew("t1", NS, "tok-a", 30, frame=b'{"keys":[]}', iteration=1)
    kinds = [("q1", "approval")]
    assert records.pause(
        "t1", NS, "tok-a", ttl_s=60, frame=b"", requests=b"[]", kinds=kinds, journal={}
    )
    decided = records.decide("t1", NS, "q1", decision="approve", body=b"{}", actor="a", event=b"{}")
    assert decided[0] == schema.Decided.RESUMED
    assert records.claim("t1", NS, "tok-b", 30, "w1").status is schema.ClaimStatus.CLAIMED
    assert records.hand_over("t1", NS, "tok-b", worker="w1", reason="shutdown")
    assert records.claim("t1", NS, "tok-c", 30, "w1").status is schema.ClaimStatus.CLAIMED
    assert records.write_tokens("t1", NS, "tok-c", "hel", check_ms=60_000)
    assert records.schedule_retry(
        "t1", NS, "tok-c", delay_ms=0, next_attempt=2, checkpoint=b"{}", error="e"
    )
    assert records.due_indices({k.retries: 0, k.pending: 60_000}) == {k.retries}
    assert records.take_due(k, k.retries, limit=10, bump_ms=1000)
    assert records.claim("t1", NS, "tok-d", 30, "w1").status is schema.ClaimStatus.CLAIMED
    assert records.wait(
        "t1",
        NS,
        "tok-d",
        due_at_ms=0,
        waiting_for="budget",
        budget="fake:m1",
        limit="requests:1/1s",
    )
    assert records.claim("t1", NS, "tok-d", 30, "w1").status is schema.ClaimStatus.CLAIMED
    records.add_usage("t1", NS, b'{"bucketMs":300000,"ttlS":60,"rows":[["a","b",1]]}')
    assert records.lease_holder(NS) == "t1"
    ended = records.succeed("t1", NS, "tok-d", envelope=b"{}", result=b'{"content":""}', ttl_s=60)
    assert ended.ended
    assert not records.drop_tokens(k, "t1", ttl_ms=60_000)  # ended just now: not yet
    assert records.claim("t2", NS, "tok-e", 30, "w1").status is schema.ClaimStatus.CLAIMED
    entry = b'{"id":"dl-t2","reason":"non_resumable","taskId":"t2"}'
    assert records.dead_letter(
        "t2", NS, "tok-e", entry_id="dl-t2", entry=entry, reason="non_resumable"
    ).ended
    register("t4")
    assert records.cancel("t4", NS, reason="not needed", ttl_s=60).ended
    records.script("worker_beat")(keys=[records.keys.workers], args=["w1", b"[]", 4])
    records.gate = ("{schematest:fair}", b'{"weights":{"":1},"dw":1,"caps":{"":-1},"dc":-1}')
    assert records.gate_fill(10) == []
    assert records.gate_sweep(60_000, 100) == 0


def key_named(name: str, keys: Keys, k: ShardKeys, turn_id: str) -> set[str]:
    """The keys a KEYS name may stand for in a call about `turn_id` of conversation NS."""
    if name in ("turn", "events"):
        return {getattr(k, name)(turn_id)}
    if name in ("queue", "lease", "conversation", "conversation_frames"):
        return {getattr(k, name)(NS)}
    if name == "index":  # take_due's: any of the shard's time indices
        return {k.retries, k.running, k.pending, k.deadlines, k.pauses, k.finished}
    if name == "workers":
        return {keys.workers}
    if name in ("celery_result", "broker_queue"):  # the turn's own key when not written
        return {k.turn(turn_id)}
    return {getattr(k, name)}


def test_each_call_site_passes_the_keys_its_names_stand_for(client: redis.Redis) -> None:
    records = RecordedRecords(client)
    every_script(records)
    assert {name for name, _, _ in records.calls} == set(schema.SCRIPTS)
    k = records.keys.for_namespace(NS)
    for name, keys, args in records.calls:
        script = schema.SCRIPTS[name]
        assert len(keys) == len(script.keys), name
        assert len(args) >= len(script.args), name
        named_args = dict(zip(script.args, args, strict=False))
        turn_id = named_args.get("turn_id", "")
        for key_name, key in zip(script.keys, keys, strict=True):
            assert key in key_named(key_name, records.keys, k, turn_id), (name, key_name, key)
        if "turn_prefix" in named_args:
            assert named_args["turn_prefix"] == k.turn_prefix, name
