"""JSON numbers as the reference writes them (p05): what JSON.stringify gives for a double, and
that every value this project writes, a loaded checkpoint's included, uses that text."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from typing import Any

import orjson
import pytest

from agent import AgentRunCheckpoint
from agent.jsnumbers import js_json, js_number, js_number_text, normalize_in_place, plain_json
from tests.agent.support import wire_checkpoint

# (Python value, what node's JSON.stringify writes for it), recorded with node v20.
JS_WRITES = [
    (1.0, "1"),
    (-0.0, "0"),
    (2.5, "2.5"),
    (1e21, "1e+21"),
    (1e-7, "1e-7"),
    (123456789012345680000.0, "123456789012345680000"),
    (0.1 + 0.2, "0.30000000000000004"),
    (1e-6, "0.000001"),
    (1.5e-6, "0.0000015"),
    (0.000012, "0.000012"),
    (2.0**53, "9007199254740992"),
    (2.0**53 + 2, "9007199254740994"),
    (2.0**60, "1152921504606847000"),
    (2.0**64, "18446744073709552000"),
    (1e16, "10000000000000000"),
    (1e20, "100000000000000000000"),
    (9.999999999999999e20, "999999999999999900000"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (-1e-7, "-1e-7"),
    (100.0, "100"),
    (12.5, "12.5"),
    (1e300, "1e+300"),
    (-2.5e-8, "-2.5e-8"),
    # Integers beyond 2**53 are doubles there too: the nearest one is written.
    (2**53 + 1, "9007199254740992"),
    (2**64, "18446744073709552000"),
    (7, "7"),
    (-(2**53), "-9007199254740992"),
]


@pytest.mark.parametrize(("value", "written"), JS_WRITES)
def test_a_number_is_written_as_json_stringify_writes_it(value: float, written: str) -> None:
    assert orjson.dumps(js_number(value)).decode() == written
    assert js_number_text(float(value)) == written


@pytest.mark.parametrize(("value", "written"), JS_WRITES)
def test_a_normalised_number_reads_back_as_the_same_double(value: float, written: str) -> None:
    back = orjson.loads(orjson.dumps(js_number(value)))
    assert float(back) == float(written)


def test_a_safe_whole_float_becomes_an_int_and_other_numbers_stay_as_they_are() -> None:
    assert type(js_number(2.0)) is int and type(js_number(-0.0)) is int
    assert js_number(12.5) == 12.5 and type(js_number(12.5)) is float
    ten = 10
    assert js_number(ten) is ten


def test_the_p05_args_are_written_as_the_reference_wrote_them() -> None:
    args = {"qty": 2.0, "big": 1e21, "neg": -0.0, "tiny": 1e-7}
    assert orjson.dumps(js_json(args)) == b'{"qty":2,"big":1e+21,"neg":0,"tiny":1e-7}'


def test_js_json_copies_only_what_changed() -> None:
    plain = {"a": [1, "x", {"b": True}], "c": None}
    assert js_json(plain) is plain
    mixed = {"keep": {"s": "x"}, "change": [1.0]}
    out = js_json(mixed)
    assert out is not mixed and out["keep"] is mixed["keep"] and out["change"] == [1]
    assert mixed["change"] == [1.0] and type(mixed["change"][0]) is float, "input untouched"
    assert js_json((1.0, 2)) == [1, 2]


def test_normalize_in_place_rewrites_parsed_json_without_copying() -> None:
    value = orjson.loads(b'{"a":[2.0,{"b":-0.0}],"c":"2.0","d":0.000001,"e":1e+21}')
    inner = value["a"]
    normalize_in_place(value)
    assert value["a"] is inner
    assert orjson.dumps(value) == b'{"a":[2,{"b":0}],"c":"2.0","d":0.000001,"e":1e+21}'


def test_plain_json_gives_tools_numbers_not_fragments() -> None:
    args = js_json({"tiny": 1.5e-6, "n": 1, "deep": [{"x": 1.5e-6}]})
    assert isinstance(args["tiny"], orjson.Fragment)
    assert plain_json(args) == {"tiny": 1.5e-6, "n": 1, "deep": [{"x": 1.5e-6}]}
    same = {"a": 1, "b": ["x"]}
    assert plain_json(same) is same


# ---------------------------------------------------------------------------------------------
# checkpoints written with floats


def floats_checkpoint() -> dict[str, Any]:
    return wire_checkpoint(
        lastCompletedIteration=2.0,
        checkpointedAt=1796000000000.0,
        history=[
            {"role": "user", "content": "Measure it."},
            {
                "role": "assistant",
                "content": "",
                "toolCalls": [
                    {
                        "id": "call_1",
                        "name": "measure",
                        "args": {
                            "qty": 2.0,
                            "neg": -0.0,
                            "tiny": 1e-6,
                            "big": 1.2345678901234568e20,
                        },
                    }
                ],
            },
        ],
        futureThing={"score": 3.0},
    )


EXPECTED_ARGS = b'{"qty":2,"neg":0,"tiny":0.000001,"big":123456789012345680000}'


@pytest.mark.parametrize("door", ["from_json", "from_dict"])
def test_a_checkpoint_written_with_floats_is_written_back_as_the_reference_writes_it(
    door: str,
) -> None:
    wire = floats_checkpoint()
    checkpoint = (
        AgentRunCheckpoint.from_json(orjson.dumps(wire))
        if door == "from_json"
        else AgentRunCheckpoint.from_dict(wire)
    )
    data = checkpoint.to_json()
    assert EXPECTED_ARGS in data
    assert b'"lastCompletedIteration":2,' in data
    assert b'"checkpointedAt":1796000000000' in data
    assert b'"futureThing":{"score":3}' in data
    assert AgentRunCheckpoint.from_json(data) == checkpoint
    assert checkpoint.to_dict()["history"][1]["toolCalls"][0]["args"]["tiny"] == 1e-6


def test_a_checkpoint_in_the_reference_form_is_written_byte_for_byte() -> None:
    data = (
        b'{"version":1,"runId":"r","history":[{"role":"assistant","content":"",'
        b'"toolCalls":[{"id":"c","name":"m","args":' + EXPECTED_ARGS + b"}]}],"
        b'"lastCompletedIteration":2,"originalInput":{"message":"m"}}'
    )
    assert AgentRunCheckpoint.from_json(data).to_json() == data


# ---------------------------------------------------------------------------------------------
# against node itself, where it is installed


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_random_doubles_are_written_as_node_writes_them() -> None:
    rnd = random.Random(62)
    values: list[float] = []
    while len(values) < 5000:
        bits = struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0]
        if bits == bits and abs(bits) != float("inf"):
            values.append(bits)
        values.append(rnd.uniform(-1, 1) * 10 ** rnd.randint(-12, 25))
        values.append(float(rnd.randint(-(10**22), 10**22)))
    script = (
        "const hs=require('fs').readFileSync(0,'utf8').trim().split('\\n');"
        "console.log(JSON.stringify(hs.map(h=>JSON.stringify(Buffer.from(h,'hex')"
        ".readDoubleBE(0)))));"
    )
    done = subprocess.run(
        ["node", "-e", script],
        input="\n".join(struct.pack(">d", v).hex() for v in values),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    expected = orjson.loads(done.stdout)
    wrong = [
        (v, e)
        for v, e in zip(values, expected, strict=True)
        if orjson.dumps(js_number(v)).decode() != e
    ]
    assert wrong == []
