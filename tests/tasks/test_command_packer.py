"""The state store's command packer (tasks/store/client.py, HiredisPacker): hiredis packs the
arguments itself, to the very bytes redis-py's own packing sends, and hands redis-py what it
does not take; the state client `connect` makes uses it, against a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from tasks.core.state_url import parse_state_url
from tasks.store.client import HiredisPacker, LuaScript, connect
from tasks.testing import RedisServer

ARGUMENT = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
)


def redis_py_packing(*args: Any) -> bytes:
    return b"".join(redis.Connection().pack_command(*args))  # type: ignore[no-untyped-call]


def ours(*args: Any) -> bytes:
    return b"".join(HiredisPacker().pack(*args))


@given(st.lists(ARGUMENT, max_size=30))
def test_arguments_are_packed_to_the_bytes_redis_py_sends(arguments: list[Any]) -> None:
    # Text that UTF-8 cannot encode (a lone surrogate) fails alike on both sides.
    try:
        expected = redis_py_packing("EVALSHA", *arguments)
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            ours("EVALSHA", *arguments)
        return
    assert ours("EVALSHA", *arguments) == expected


@pytest.mark.parametrize(
    "arguments",
    [
        ("SCRIPT LOAD", "return 1"),  # a two-word command name is split, as redis-py does
        (b"CLIENT SETNAME", b"worker"),
        ("SET", "k", memoryview(b"value")),
        ("SET", "k", bytearray(b"value")),  # hiredis refuses it: redis-py's packing converts it
        ("SET", "k", "é ✓ 𝄞"),
    ],
)
def test_other_arguments_are_packed_as_redis_py_packs_them(arguments: tuple[Any, ...]) -> None:
    assert ours(*arguments) == redis_py_packing(*arguments)


@pytest.mark.parametrize("bad", [True, None, {"a": 1}, [1]])
def test_what_redis_py_refuses_is_refused_with_its_error(bad: Any) -> None:
    with pytest.raises(redis.DataError):
        redis_py_packing("SET", "k", bad)
    with pytest.raises(redis.DataError):
        ours("SET", "k", bad)


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    made = connect(parse_state_url(redis_server.url))
    assert isinstance(made, redis.Redis)
    made.flushdb()
    yield made
    made.close()


def test_the_state_client_sends_through_it(client: redis.Redis) -> None:
    # The client `connect` makes packs with hiredis alone...
    connection = client.connection_pool.get_connection()
    try:
        assert isinstance(connection._command_packer, HiredisPacker)
    finally:
        client.connection_pool.release(connection)
    # ...and a script gets every argument as redis-py would have sent it.
    echo = LuaScript(client, "return ARGV")
    sent = ["text é", b"\x00\xffbytes", 42, -(2**70), 2.5, memoryview(b"view")]
    assert echo(args=sent) == [
        b"text \xc3\xa9",
        b"\x00\xffbytes",
        b"42",
        b"-1180591620717411303424",
        b"2.5",
        b"view",
    ]
    assert client.script_load("return 1") == LuaScript(client, "return 1").sha
    with pytest.raises(redis.DataError):
        client.set("k", True)  # type: ignore[arg-type]
