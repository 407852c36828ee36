"""The store's side of streaming, driven directly against a real Redis, no workers: the token
write (tasks/store/lua/tokens.lua) is fenced by the lease; attempt.discarded comes before a
retry of an attempt that streamed (retry.lua) and before a takeover's deltas of the same
iteration, never for deltas that stand; the pump's sweep (drop_tokens.lua) removes a turn's
deltas only once it ended the token TTL ago, and nothing else. Then the worker's writer
(tasks/turn/tokens.py) on its own: coalescing, order, a refused or failed write."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from agent import TokenDelta
from tasks.core.keys import Keys, ShardKeys
from tasks.core.settings import SettingsError, load_settings
from tasks.store.records import ClaimStatus, TurnRecords
from tasks.testing import RedisServer
from tasks.turn.tokens import TokenWriter

NS = "_/_/c-stream"
PAYLOAD = b'{"agent":"demo","conversation_id":"c-stream","message":"hi"}'
HOUR_MS = 3_600_000


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushdb()
    yield connection
    connection.close()


@pytest.fixture
def records(client: redis.Redis) -> TurnRecords:
    return TurnRecords(client, Keys("streamtest", 4))


@pytest.fixture
def shard(records: TurnRecords) -> ShardKeys:
    return records.keys.for_namespace(NS)


def started(records: TurnRecords, token: str = "tok-a", lease_s: float = 30.0) -> None:
    """Turn t1 registered and claimed under `token`."""
    records.register("t1", payload=PAYLOAD, agent="demo", conversation_id="c-stream", namespace=NS)
    claim(records, token, lease_s)


def claim(records: TurnRecords, token: str, lease_s: float = 30.0) -> None:
    assert records.claim("t1", NS, token, lease_s, "w1").status is ClaimStatus.CLAIMED


def write(records: TurnRecords, text: str, token: str = "tok-a") -> bool:
    return records.write_tokens("t1", NS, token, text, check_ms=HOUR_MS)


def retry(records: TurnRecords, token: str) -> None:
    assert records.schedule_retry(
        "t1", NS, token, delay_ms=0, next_attempt=2, checkpoint=b"{}", error="e"
    )


def events(client: redis.Redis, shard: ShardKeys) -> list[tuple[str, dict[str, Any]]]:
    """(type, data) of each event of t1, with the attempt in the data of a delta."""
    found = []
    entries: Any = client.xrange(shard.events("t1"))
    for _, fields in entries:
        data = orjson.loads(fields[b"data"])
        if fields[b"type"] == b"token.delta":
            data["attempt"] = int(fields[b"attempt"])
        found.append((fields[b"type"].decode(), data))
    return found


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- the write, the lease and attempt.discarded --------------------------------------------------


def test_a_delta_is_an_event_of_the_turn_fenced_by_the_lease(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    # Given a claimed turn whose lease runs out and another delivery takes it over
    started(records, lease_s=0.2)
    assert write(records, "Hel")
    time.sleep(0.3)
    claim(records, "tok-b")
    # When the first delivery writes again, Then it is refused and nothing is written
    assert not write(records, "lo")
    assert [t for t, _ in events(client, shard)].count("token.delta") == 1
    # And the first write entered the turn in the shard's token index, due a check later
    due = client.zscore(shard.tokens, "t1")
    assert due is not None and 0 < due - server_ms(client) <= HOUR_MS


def test_a_takeover_that_streams_the_same_iteration_again_discards_the_earlier_deltas(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    # Given a delivery that died mid-reply: its lease ran out, another took the turn over
    started(records, lease_s=0.2)
    assert write(records, "Hel")
    time.sleep(0.3)
    claim(records, "tok-b")
    # When the new delivery streams the same model call again
    assert write(records, "Hello", "tok-b")
    assert write(records, " there", "tok-b")
    # Then attempt.discarded comes first, once, then its deltas
    assert events(client, shard)[-4:] == [
        ("turn.started", {"worker": "w1"}),
        ("attempt.discarded", {"attempt": 1}),
        ("token.delta", {"text": "Hello", "attempt": 1}),
        ("token.delta", {"text": " there", "attempt": 1}),
    ]


def test_deltas_of_an_iteration_whose_response_was_kept_stand_after_a_handover(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    # Given a delivery that streamed a response, persisted its round and handed the turn over
    started(records)
    assert write(records, "Looking it up.")
    assert records.renew("t1", NS, "tok-a", 30, frame=b'{"keys":[]}', iteration=2)
    assert records.hand_over("t1", NS, "tok-a", worker="w1", reason="shutdown")
    claim(records, "tok-b")
    # When the next delivery streams the next iteration
    assert write(records, "Shipped.", "tok-b")
    # Then nothing is discarded
    assert "attempt.discarded" not in [t for t, _ in events(client, shard)]


def test_a_retry_after_streaming_says_attempt_discarded_first_in_the_same_step(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    # Given an attempt that streamed, then failed
    started(records)
    assert write(records, "Half a repl")
    # When its retry is scheduled
    retry(records, "tok-a")
    # Then attempt.discarded {attempt} comes right before retry.scheduled
    types = [t for t, _ in events(client, shard)]
    assert types[-3:] == ["token.delta", "attempt.discarded", "retry.scheduled"]
    assert events(client, shard)[-2][1] == {"attempt": 1}
    # And the next attempt's deltas start afresh: nothing more is discarded, then or after
    claim(records, "tok-c")
    assert write(records, "A whole reply.", "tok-c")
    retry_types = [t for t, _ in events(client, shard)]
    assert retry_types.count("attempt.discarded") == 1
    assert events(client, shard)[-1] == ("token.delta", {"text": "A whole reply.", "attempt": 2})


def test_a_retry_of_an_attempt_that_did_not_stream_discards_nothing(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    started(records)
    retry(records, "tok-a")
    assert "attempt.discarded" not in [t for t, _ in events(client, shard)]


# -- the sweep -----------------------------------------------------------------------------------


def test_the_sweep_waits_for_the_turn_to_end_then_for_the_ttl(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    started(records)
    assert write(records, "Done.")
    # While the turn runs: not yet, looked at again a TTL from now
    assert not records.drop_tokens(shard, "t1", ttl_ms=60_000)
    again = client.zscore(shard.tokens, "t1")
    assert again is not None and again > server_ms(client) + 50_000
    # Once it ended: a TTL after its end
    ended = records.succeed("t1", NS, "tok-a", envelope=b"{}", result=b'{"content":""}', ttl_s=60)
    assert ended.ended
    assert not records.drop_tokens(shard, "t1", ttl_ms=60_000)
    finished_at = int(client.hget(shard.turn("t1"), "finished_at_ms") or 0)
    assert client.zscore(shard.tokens, "t1") == finished_at + 60_000
    assert "token.delta" in [t for t, _ in events(client, shard)]


def test_the_sweep_removes_the_deltas_alone_once_the_ttl_passed(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    # Given an ended turn with deltas among its other events
    started(records)
    for piece in ("One", " two", " three."):
        assert write(records, piece)
    records.succeed("t1", NS, "tok-a", envelope=b"{}", result=b'{"content":"x"}', ttl_s=60)
    before = events(client, shard)
    time.sleep(0.01)
    # When the sweep comes after the TTL
    assert records.drop_tokens(shard, "t1", ttl_ms=1)
    # Then the deltas are gone, every other event stays, and the turn left the index
    assert events(client, shard) == [e for e in before if e[0] != "token.delta"]
    assert client.zscore(shard.tokens, "t1") is None


def test_the_sweep_of_a_turn_whose_record_is_gone_drops_it_from_the_index(
    records: TurnRecords, client: redis.Redis, shard: ShardKeys
) -> None:
    client.zadd(shard.tokens, {"gone": 0})
    assert records.drop_tokens(shard, "gone", ttl_ms=60_000)
    assert client.zcard(shard.tokens) == 0


def test_the_settings_refuse_a_flush_interval_that_is_no_interval() -> None:
    assert load_settings({}).token_flush_ms == 50 and load_settings({}).token_ttl_s == 3600
    for value in ("0", "-5", "0.5", "61000"):
        with pytest.raises(SettingsError, match="AGENTJOBS_TOKEN_FLUSH_MS"):
            load_settings({"AGENTJOBS_TOKEN_FLUSH_MS": value})
    with pytest.raises(SettingsError, match="AGENTJOBS_TOKEN_TTL_S"):
        load_settings({"AGENTJOBS_TOKEN_TTL_S": "0"})


# -- the writer ----------------------------------------------------------------------------------


class Store:
    """What a TokenWriter writes, in order; `fail` raises once, `refuse` answers False."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.fail = False
        self.refuse = False

    def write(self, text: str) -> bool:
        if self.fail:
            self.fail = False
            raise redis.ConnectionError("away for a moment")
        self.written.append(text)
        return not self.refuse


def pieces(count: int) -> list[TokenDelta]:
    return [TokenDelta(1, f"p{i} ") for i in range(count)]


def test_the_writer_coalesces_pieces_into_one_write_per_interval() -> None:
    # Given an interval longer than the stream
    store = Store()
    writer = TokenWriter(store.write, flush_ms=60_000)
    # When 100 pieces come and the model call ends
    for delta in pieces(100):
        writer.add(delta)
    assert writer.flush()
    # Then the first went out at once, the rest in one write at the end, in order
    assert len(store.written) == 2
    assert "".join(store.written) == "".join(d.text for d in pieces(100))
    assert writer.flush() and len(store.written) == 2  # nothing held: nothing written


def test_the_writer_writes_again_once_an_interval_passed() -> None:
    store = Store()
    writer = TokenWriter(store.write, flush_ms=20)
    for delta in pieces(6):
        writer.add(delta)
        time.sleep(0.01)
    assert writer.flush()
    assert 2 <= len(store.written) <= 5
    assert "".join(store.written) == "".join(d.text for d in pieces(6))


def test_a_failed_write_keeps_its_text_for_the_next_an_interval_later() -> None:
    store = Store()
    writer = TokenWriter(store.write, flush_ms=30)
    store.fail = True
    writer.add(TokenDelta(1, "kept "))  # the write raises: the text stays held
    store.fail = True
    writer.add(TokenDelta(1, "and "))  # within the interval: not tried again yet
    time.sleep(0.04)
    with pytest.raises(redis.ConnectionError):  # the end's flush raises, for `patiently`
        writer.flush()
    assert writer.flush()
    assert store.written == ["kept and "]


def test_a_refused_write_drops_what_comes_after_and_the_end_says_so() -> None:
    store = Store()
    writer = TokenWriter(store.write, flush_ms=60_000)
    store.refuse = True
    writer.add(TokenDelta(1, "first"))  # refused: the turn is not this delivery's
    writer.add(TokenDelta(1, "second"))
    assert not writer.flush()
    assert store.written == ["first"]
