"""The Lua scripts (tasks/store/lua/*.lua), each driven directly against a real Redis through
TurnRecords, no workers: what each one writes, what it refuses, and the fence that keeps a
stale worker (one whose lease ran out and was taken over) from writing over its successor.
Every time comes from the server's clock. Last, every key a script is given, and every key its
Lua commands touch, hashes to the conversation's one cluster slot."""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import redis
from redis.client import Monitor
from redis.crc import key_slot

from tasks.core.keys import Keys
from tasks.store.records import (
    Claim,
    ClaimStatus,
    Due,
    Ended,
    Registered,
    TurnRecord,
    TurnRecords,
    TurnState,
)
from tasks.testing import RedisServer, wait_until

PREFIX = "luatest"
SHARDS = 16
NS = "_/_/c-1"
PAYLOAD = b'{"agent":"demo","conversation_id":"c-1","message":"hi"}'
CHECKPOINT_1 = b'{"version":1,"runId":"r-1","round":1}'
CHECKPOINT_2 = b'{"version":1,"runId":"r-1","round":2}'
ENVELOPE = b'{"format":"conversation-v1","data":{"runId":"r-1"},"savedAt":1}'
# Conversation frames on ENVELOPE (tasks/store/progress.py): the keys, the rest, list changes.
FRAME_1 = b'{"keys":["runId"],"head":{"runId":"r-2"},"lists":{},"on":1}'
FRAME_2 = b'{"keys":["runId"],"head":{"runId":"r-3"},"lists":{},"on":1}'
RESULT = b'{"content":"Done"}'
LEASE_S = 30.0
# A lease short enough to run out inside a test.
SHORT_LEASE_S = 0.2


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushdb()
    yield connection
    connection.close()


@pytest.fixture
def records(client: redis.Redis) -> TurnRecords:
    return TurnRecords(client, Keys(PREFIX, SHARDS))


# -- helpers -------------------------------------------------------------------------------------


def register(records: TurnRecords, turn_id: str, namespace: str = NS, **options: Any) -> Registered:
    return records.register(
        turn_id,
        payload=options.pop("payload", PAYLOAD),
        agent="demo",
        conversation_id=namespace.rsplit("/", 1)[-1],
        namespace=namespace,
        **options,
    )


def claim(
    records: TurnRecords,
    turn_id: str,
    token: str = "tok-a",
    *,
    namespace: str = NS,
    lease_ttl_s: float = LEASE_S,
    worker: str = "w1@host",
) -> Claim:
    return records.claim(turn_id, namespace, token, lease_ttl_s, worker)


def record(records: TurnRecords, turn_id: str, namespace: str = NS) -> TurnRecord:
    found = records.get(turn_id, namespace)
    assert found is not None, f"no record for {turn_id}"
    return found


def succeed(records: TurnRecords, turn_id: str, token: str, namespace: str = NS) -> Ended:
    return records.succeed(turn_id, namespace, token, envelope=ENVELOPE, result=RESULT, ttl_s=3600)


def dead_letter(
    records: TurnRecords,
    turn_id: str,
    token: str,
    namespace: str = NS,
    checkpoint: bytes = b"",
) -> Ended:
    entry = orjson.dumps({"id": f"dl-{turn_id}", "reason": "non_resumable", "taskId": turn_id})
    return records.dead_letter(
        turn_id,
        namespace,
        token,
        entry_id=f"dl-{turn_id}",
        entry=entry,
        reason="non_resumable",
        checkpoint=checkpoint,
    )


def retry(records: TurnRecords, turn_id: str, token: str, delay_ms: int, attempt: int = 2) -> int:
    return records.schedule_retry(
        turn_id,
        NS,
        token,
        delay_ms=delay_ms,
        next_attempt=attempt,
        checkpoint=CHECKPOINT_1,
        error="ProviderHTTPError: HTTP 503",
    )


def score(client: redis.Redis, key: str, member: str) -> float | None:
    value = client.zscore(key, member)
    return None if value is None else float(value)


def shard(records: TurnRecords, namespace: str = NS) -> Any:
    return records.keys.for_namespace(namespace)


# -- register / unregister -----------------------------------------------------------------------


def test_register_records_a_queued_turn_at_the_tail_of_its_conversation(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a conversation with one turn already submitted
    assert register(records, "t1") is Registered.CREATED
    before = records.server_time_ms()

    # When a second turn is registered
    recorded = register(records, "t2")
    after = records.server_time_ms()

    # Then it is queued behind the first, with its submission fields and the server's time
    assert recorded is Registered.CREATED
    k = shard(records)
    assert client.lrange(k.queue(NS), 0, -1) == [b"t1", b"t2"]
    turn = record(records, "t2")
    assert turn.state is TurnState.QUEUED
    assert (turn.agent, turn.conversation_id, turn.namespace) == ("demo", "c-1", NS)
    assert turn.payload == orjson.loads(PAYLOAD)
    assert (turn.attempt, turn.deliveries, turn.checkpoint) == (1, 0, b"")
    assert before <= turn.created_at_ms == turn.updated_at_ms <= after
    # and the pending index knows it since then, so the pump can wake it if it stalls
    assert score(client, k.pending, "t2") == turn.created_at_ms


def test_register_again_leaves_the_recorded_turn_as_it_is(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a registered turn
    assert register(records, "t1")
    first = record(records, "t1")

    # When the same turn id is registered again: with the same payload, then with another
    same = register(records, "t1", checkpoint=CHECKPOINT_1)
    other = register(records, "t1", payload=b'{"message":"other"}', checkpoint=CHECKPOINT_1)

    # Then the first is a resubmission, the second a conflict, and nothing changes: one queue
    # entry, the first payload, no checkpoint
    assert (same, other) == (Registered.EXISTS, Registered.CONFLICT)
    assert client.lrange(shard(records).queue(NS), 0, -1) == [b"t1"]
    assert record(records, "t1") == first


def test_register_keeps_a_replays_checkpoint_and_origin(records: TurnRecords) -> None:
    # When a dead-letter replay registers its turn with the entry's checkpoint
    assert register(records, "t1", checkpoint=CHECKPOINT_1, replay_of="dl-t0") is Registered.CREATED

    # Then the record starts from that checkpoint and names the entry it replays
    turn = record(records, "t1")
    assert turn.checkpoint == CHECKPOINT_1
    assert turn.replay_of == "dl-t0"


def test_a_turn_without_a_namespace_is_recorded_but_queued_nowhere(
    records: TurnRecords, client: redis.Redis
) -> None:
    # When a payload too broken to name a conversation is registered
    assert register(records, "bad", namespace="") is Registered.CREATED

    # Then it has a record and a pending entry (its worker dead-letters it), but no queue
    k = shard(records, "")
    assert record(records, "bad", "").state is TurnState.QUEUED
    assert client.llen(k.queue("")) == 0
    assert score(client, k.pending, "bad") is not None


def test_unregister_takes_a_queued_turn_back(records: TurnRecords, client: redis.Redis) -> None:
    # Given two queued turns of one conversation
    register(records, "t1")
    register(records, "t2")

    # When the first is unregistered (its message could not be published)
    records.unregister("t1", NS)

    # Then it is gone from the records, the queue and the pending index
    k = shard(records)
    assert records.get("t1", NS) is None
    assert client.lrange(k.queue(NS), 0, -1) == [b"t2"]
    assert score(client, k.pending, "t1") is None


def test_unregister_leaves_a_turn_that_started(records: TurnRecords, client: redis.Redis) -> None:
    # Given a turn a worker already claimed
    register(records, "t1")
    assert claim(records, "t1").status is ClaimStatus.CLAIMED

    # When unregister is called for it
    records.unregister("t1", NS)

    # Then the running turn keeps its record, its queue place and its lease
    assert record(records, "t1").state is TurnState.RUNNING
    assert client.lrange(shard(records).queue(NS), 0, -1) == [b"t1"]
    assert records.lease_holder(NS) == "t1"


# -- claim ---------------------------------------------------------------------------------------


def test_claim_takes_the_head_with_a_lease_and_returns_its_record(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a queued turn at the head of its conversation, and a stored conversation
    register(records, "t1")
    k = shard(records)
    client.set(k.conversation(NS), ENVELOPE)
    before = records.server_time_ms()

    # When a worker claims it
    claimed = claim(records, "t1", "tok-a", worker="w1@host")
    after = records.server_time_ms()

    # Then it is running under that worker's token, and the claim carries the record and the
    # stored conversation it starts from
    assert claimed.status is ClaimStatus.CLAIMED
    assert claimed.record is not None
    assert claimed.record == record(records, "t1")
    assert claimed.record.state is TurnState.RUNNING
    assert (claimed.record.token, claimed.record.worker) == ("tok-a", "w1@host")
    assert (claimed.record.deliveries, claimed.record.redeliveries) == (1, 0)
    assert before <= claimed.record.started_at_ms <= after
    assert (claimed.stored, claimed.stored_frames) == (ENVELOPE, ())
    # and the lease is the turn's for lease_ttl_s; the running index expects it to end then
    assert records.lease_holder(NS) == "t1"
    assert LEASE_S * 1000 - 1000 < client.pttl(k.lease(NS)) <= LEASE_S * 1000
    assert score(client, k.running, "t1") == claimed.record.started_at_ms + LEASE_S * 1000
    assert score(client, k.pending, "t1") is None


def test_the_claim_brings_the_conversation_frames_on_the_stored_envelope(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a stored conversation of an envelope and two conversation frames
    k = shard(records)
    client.set(k.conversation(NS), ENVELOPE)
    client.rpush(k.conversation_frames(NS), FRAME_1, FRAME_2)
    register(records, "t1")

    # When its next turn is claimed
    claimed = claim(records, "t1")

    # Then the claim brings the envelope and the frames, in order
    assert claimed.status is ClaimStatus.CLAIMED
    assert (claimed.stored, claimed.stored_frames) == (ENVELOPE, (FRAME_1, FRAME_2))


def test_a_turn_with_its_own_checkpoint_is_claimed_without_the_stored_conversation(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a replayed turn that starts from its own checkpoint, and a stored conversation
    register(records, "t1", checkpoint=CHECKPOINT_1)
    client.set(shard(records).conversation(NS), ENVELOPE)
    client.rpush(shard(records).conversation_frames(NS), FRAME_1)

    # When it is claimed
    claimed = claim(records, "t1")

    # Then the claim brings its checkpoint and no stored conversation
    assert claimed.status is ClaimStatus.CLAIMED
    assert claimed.record is not None and claimed.record.checkpoint == CHECKPOINT_1
    assert (claimed.stored, claimed.stored_frames) == (None, ())


def test_claim_refuses_a_turn_that_was_never_registered(records: TurnRecords) -> None:
    assert claim(records, "nobody").status is ClaimStatus.MISSING
    assert records.lease_holder(NS) is None


def test_claim_refuses_a_turn_that_ended(records: TurnRecords, client: redis.Redis) -> None:
    # Given a turn that succeeded
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert succeed(records, "t1", "tok-a").ended

    # When a late duplicate delivery claims it
    again = claim(records, "t1", "tok-b")

    # Then it is refused as done and takes no lease
    assert again.status is ClaimStatus.DONE
    assert again.record is None
    assert records.lease_holder(NS) is None
    assert record(records, "t1").deliveries == 1


def test_claim_refuses_a_retry_before_it_is_due(records: TurnRecords) -> None:
    # Given a turn waiting out a 60 s backoff
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert retry(records, "t1", "tok-a", delay_ms=60_000)

    # When a wake-up arrives early
    early = claim(records, "t1", "tok-b")

    # Then it is refused as not due; the turn keeps waiting with no lease
    assert early.status is ClaimStatus.NOT_DUE
    assert record(records, "t1").state is TurnState.WAITING
    assert records.lease_holder(NS) is None


def test_claim_takes_a_retry_once_it_is_due(records: TurnRecords, client: redis.Redis) -> None:
    # Given a turn whose backoff of 50 ms has passed
    register(records, "t1")
    claim(records, "t1", "tok-a")
    due = retry(records, "t1", "tok-a", delay_ms=50)
    wait_until(lambda: records.server_time_ms() >= due, 5, "the retry to be due")

    # When it is claimed
    claimed = claim(records, "t1", "tok-b")

    # Then attempt 2 starts as its first delivery, from the kept checkpoint, off the retry index
    assert claimed.status is ClaimStatus.CLAIMED
    assert claimed.record is not None
    assert (claimed.record.attempt, claimed.record.deliveries) == (2, 1)
    assert claimed.record.checkpoint == CHECKPOINT_1
    assert claimed.stored is None
    assert score(client, shard(records).retries, "t1") is None


def test_claim_refuses_a_turn_behind_an_unfinished_one(records: TurnRecords) -> None:
    # Given two queued turns of one conversation
    register(records, "t1")
    register(records, "t2")

    # When the second is delivered first
    refused = claim(records, "t2", "tok-b")

    # Then it is refused as not the head, and the first can still be claimed
    assert refused.status is ClaimStatus.NOT_HEAD
    assert record(records, "t2").state is TurnState.QUEUED
    assert claim(records, "t1", "tok-a").status is ClaimStatus.CLAIMED


def test_claim_refuses_a_second_delivery_while_the_lease_stands(records: TurnRecords) -> None:
    # Given a turn running under one delivery's lease
    register(records, "t1")
    claim(records, "t1", "tok-a")

    # When a duplicate message of the same turn is delivered to another worker
    duplicate = claim(records, "t1", "tok-b", worker="w2@host")

    # Then it is refused as busy; the first delivery keeps the turn
    assert duplicate.status is ClaimStatus.BUSY
    turn = record(records, "t1")
    assert (turn.token, turn.worker, turn.deliveries) == ("tok-a", "w1@host", 1)


def test_claim_after_the_lease_ran_out_is_a_redelivery(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a running turn whose worker died: its short lease runs out
    register(records, "t1")
    claim(records, "t1", "tok-a", lease_ttl_s=SHORT_LEASE_S)
    wait_until(lambda: not client.exists(shard(records).lease(NS)), 5, "the lease to run out")

    # When another worker claims it
    taken = claim(records, "t1", "tok-b", worker="w2@host")

    # Then it takes the turn over, counted as a redelivery of the same attempt
    assert taken.status is ClaimStatus.CLAIMED
    assert taken.record is not None
    assert (taken.record.token, taken.record.worker) == ("tok-b", "w2@host")
    assert (taken.record.attempt, taken.record.deliveries, taken.record.redeliveries) == (1, 2, 1)


# -- progress (renew) ----------------------------------------------------------------------------


def test_progress_persists_the_checkpoint_and_extends_the_lease(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a turn claimed with a 1 s lease
    register(records, "t1")
    claim(records, "t1", "tok-a", lease_ttl_s=1.0)
    k = shard(records)
    before = records.server_time_ms()

    # When its worker reports round 2's checkpoint with a 30 s lease
    renewed = records.renew("t1", NS, "tok-a", LEASE_S, frame=CHECKPOINT_2, iteration=2)
    after = records.server_time_ms()

    # Then the checkpoint and iteration are stored, and the lease and running index move on
    assert renewed is True
    turn = record(records, "t1")
    assert (turn.frames, turn.iteration) == ((CHECKPOINT_2,), 2)
    assert before <= turn.updated_at_ms <= after
    assert client.pttl(k.lease(NS)) > 1000
    running_until = score(client, k.running, "t1")
    assert running_until is not None
    assert before + LEASE_S * 1000 <= running_until <= after + LEASE_S * 1000


def test_renew_without_a_checkpoint_only_extends_the_lease(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a turn that persisted round 1, on a 1 s lease
    register(records, "t1")
    claim(records, "t1", "tok-a", lease_ttl_s=1.0)
    records.renew("t1", NS, "tok-a", 1.0, frame=CHECKPOINT_1, iteration=1)

    # When the lease keeper renews it for 30 s
    assert records.renew("t1", NS, "tok-a", LEASE_S)

    # Then the lease is longer and the progress is as it was
    assert client.pttl(shard(records).lease(NS)) > 1000
    turn = record(records, "t1")
    assert (turn.frames, turn.iteration) == ((CHECKPOINT_1,), 1)


def test_progress_under_a_wrong_token_is_refused(records: TurnRecords, client: redis.Redis) -> None:
    # Given a turn running under token tok-a with a 1 s lease, at round 1
    register(records, "t1")
    claim(records, "t1", "tok-a", lease_ttl_s=1.0)
    records.renew("t1", NS, "tok-a", 1.0, frame=CHECKPOINT_1, iteration=1)
    k = shard(records)
    running_until = score(client, k.running, "t1")

    # When a writer with another token reports progress
    renewed = records.renew("t1", NS, "tok-x", LEASE_S, frame=CHECKPOINT_2, iteration=2)

    # Then it is refused: no checkpoint, no longer lease, the running index unchanged
    assert renewed is False
    turn = record(records, "t1")
    assert (turn.frames, turn.iteration) == ((CHECKPOINT_1,), 1)
    assert client.pttl(k.lease(NS)) <= 1000
    assert score(client, k.running, "t1") == running_until


def test_a_stale_worker_cannot_write_over_the_worker_that_took_its_turn_over(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given worker A's lease ran out (it stalled) and worker B took the turn over at round 1
    register(records, "t1")
    register(records, "t2")
    claim(records, "t1", "tok-a", lease_ttl_s=SHORT_LEASE_S)
    k = shard(records)
    wait_until(lambda: not client.exists(k.lease(NS)), 5, "A's lease to run out")
    assert claim(records, "t1", "tok-b", worker="w2@host").status is ClaimStatus.CLAIMED
    assert records.renew("t1", NS, "tok-b", LEASE_S, frame=CHECKPOINT_1, iteration=1)

    # When A wakes up and tries every write a running turn makes
    renewed = records.renew("t1", NS, "tok-a", LEASE_S)
    progressed = records.renew("t1", NS, "tok-a", LEASE_S, frame=CHECKPOINT_2, iteration=2)
    succeeded = succeed(records, "t1", "tok-a")
    retried = retry(records, "t1", "tok-a", delay_ms=1000)
    dead = dead_letter(records, "t1", "tok-a")

    # Then each is refused, and B's turn is untouched: running, its checkpoint, its lease
    assert (renewed, progressed, retried) == (False, False, 0)
    assert succeeded == Ended(False)
    assert dead == Ended(False)
    turn = record(records, "t1")
    assert turn.state is TurnState.RUNNING
    assert (turn.token, turn.frames, turn.iteration) == ("tok-b", (CHECKPOINT_1,), 1)
    assert records.lease_holder(NS) == "t1"
    assert client.get(k.lease(NS)) == b"t1|tok-b"
    assert client.get(k.conversation(NS)) is None
    assert client.hlen(k.dead_letters) == 0
    assert score(client, k.retries, "t1") is None
    assert client.lrange(k.queue(NS), 0, -1) == [b"t1", b"t2"]
    # and B still finishes it
    assert succeed(records, "t1", "tok-b") == Ended(True, "t2", "demo")


# -- journal and frames --------------------------------------------------------------------------

JOURNAL = {"journal:response": b'{"historyLength":1}', "journal:calls": b"2"}


def journal_of(records: TurnRecords, turn_id: str = "t1") -> dict[str, bytes]:
    return record(records, turn_id).journal


def event_types(client: redis.Redis, records: TurnRecords, turn_id: str = "t1") -> list[bytes]:
    return [fields[b"type"] for _, fields in client.xrange(shard(records).events(turn_id))]


def test_the_journal_is_written_with_its_event_under_the_lease(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a running turn
    register(records, "t1")
    claim(records, "t1", "tok-a")

    # When its worker journals a response, then a call's start with its event
    assert records.write_journal("t1", NS, "tok-a", JOURNAL)
    started = {"journal:0": b'{"attempt":1}'}
    event = b'{"tool":"pay","toolCallId":"c1"}'
    assert records.write_journal(
        "t1", NS, "tok-a", started, event_type="tool.started", event_data=event
    )

    # Then both are in the record, and the event in the stream
    assert journal_of(records) == {**JOURNAL, **started}
    assert event_types(client, records)[-1] == b"tool.started"


def test_a_journal_write_under_a_wrong_token_is_refused(
    records: TurnRecords, client: redis.Redis
) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert not records.write_journal("t1", NS, "tok-x", JOURNAL, event_type="tool.started")
    assert journal_of(records) == {}
    assert event_types(client, records) == [b"turn.queued", b"turn.started"]


def test_frames_accumulate_and_a_round_drops_its_journal(records: TurnRecords) -> None:
    # Given a running turn with a journal of its iteration in flight
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.write_journal("t1", NS, "tok-a", {**JOURNAL, "journal:0": b"{}", "journal:1": b"{}"})

    # When a frame that does not end the iteration (a seed, a fold) is persisted
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f1", iteration=1, ends_iteration=False)
    # Then the journal stays
    assert len(journal_of(records)) == 4

    # When the round ends with a second frame
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f2", iteration=2)
    # Then both frames are kept in order and the journal is gone
    turn = record(records, "t1")
    assert (turn.frames, turn.iteration, turn.journal) == ((b"f1", b"f2"), 2, {})


def test_a_retry_replaces_the_frames_and_keeps_the_journal(records: TurnRecords) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f1", iteration=1)
    records.write_journal("t1", NS, "tok-a", JOURNAL)
    retry(records, "t1", "tok-a", delay_ms=1000)
    turn = record(records, "t1")
    # the next attempt resumes the whole checkpoint and continues the iteration in flight
    assert (turn.checkpoint, turn.frames) == (CHECKPOINT_1, ())
    assert turn.journal == JOURNAL


def test_a_turn_ended_from_outside_keeps_the_conversation_its_frames_build_on(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a running turn whose frames build on the stored conversation
    client.set(shard(records).conversation(NS), ENVELOPE)
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f1", iteration=1)
    records.write_journal("t1", NS, "tok-a", JOURNAL)

    # When it is cancelled
    records.cancel("t1", NS, reason="test", ttl_s=3600)

    # Then it keeps a copy of that conversation with its frames, and drops its journal
    turn = record(records, "t1")
    assert (turn.base, turn.frames, turn.journal) == (ENVELOPE, (b"f1",), {})


def test_a_turn_ended_from_outside_keeps_the_conversation_frames_too(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a running turn whose frames build on a stored envelope with conversation frames
    k = shard(records)
    client.set(k.conversation(NS), ENVELOPE)
    client.rpush(k.conversation_frames(NS), FRAME_1, FRAME_2)
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f1", iteration=1)

    # When it is dead-lettered
    assert dead_letter(records, "t1", "tok-a").ended

    # Then it keeps the envelope and those frames (one JSON array), with its own frames
    turn = record(records, "t1")
    assert turn.base == ENVELOPE
    assert turn.base_frames == (orjson.loads(FRAME_1), orjson.loads(FRAME_2))
    assert turn.frames == (b"f1",)
    assert client.hget(k.turn("t1"), "base_frames") == b"[" + FRAME_1 + b"," + FRAME_2 + b"]"


def test_a_turn_ended_from_outside_on_an_envelope_alone_keeps_no_frames(
    records: TurnRecords, client: redis.Redis
) -> None:
    client.set(shard(records).conversation(NS), ENVELOPE)
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f1", iteration=1)
    records.cancel("t1", NS, reason="test", ttl_s=3600)
    turn = record(records, "t1")
    assert (turn.base, turn.base_frames) == (ENVELOPE, ())
    assert not client.hexists(shard(records).turn("t1"), "base_frames")


def test_succeed_drops_the_frames_and_the_journal(records: TurnRecords) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=b"f1", iteration=1)
    records.write_journal("t1", NS, "tok-a", JOURNAL)
    succeed(records, "t1", "tok-a")
    turn = record(records, "t1")
    assert (turn.frames, turn.base, turn.journal) == ((), b"", {})


# -- succeed -------------------------------------------------------------------------------------


def test_succeed_stores_the_conversation_and_ends_the_turn(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a running turn with a persisted checkpoint, a second turn queued behind it that
    # was last woken long ago, and stale index entries for the first
    register(records, "t1")
    register(records, "t2")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=CHECKPOINT_1, iteration=1)
    k = shard(records)
    client.zadd(k.pending, {"t2": 1})
    client.zadd(k.retries, {"t1": 1})
    client.zadd(k.pending, {"t1": 1})
    before = records.server_time_ms()

    # When its worker succeeds
    ended = succeed(records, "t1", "tok-a")
    after = records.server_time_ms()

    # Then the conversation is stored and the turn is succeeded with its result, no checkpoint
    assert ended == Ended(True, "t2", "demo")
    assert client.get(k.conversation(NS)) == ENVELOPE
    turn = record(records, "t1")
    assert turn.state is TurnState.SUCCEEDED
    assert turn.result == orjson.loads(RESULT)
    assert (turn.checkpoint, turn.frames) == (b"", ())
    assert turn.token == ""
    assert before <= turn.finished_at_ms <= after
    # and the record expires after ttl_s
    assert 3590 < client.ttl(k.turn("t1")) <= 3600
    # and it is off every live index and its conversation's queue, with its lease released
    assert score(client, k.running, "t1") is None
    assert score(client, k.retries, "t1") is None
    assert score(client, k.pending, "t1") is None
    assert score(client, k.finished, "t1") == turn.finished_at_ms
    assert client.lrange(k.queue(NS), 0, -1) == [b"t2"]
    assert not client.exists(k.lease(NS))
    # and the next head is marked as woken now, so the pump does not wake it again at once
    woken = score(client, k.pending, "t2")
    assert woken is not None and before <= woken <= after


def test_succeed_with_a_frame_appends_it_to_the_conversation_frames(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a stored conversation with one frame, and its next turn running
    k = shard(records)
    client.set(k.conversation(NS), ENVELOPE)
    client.rpush(k.conversation_frames(NS), FRAME_1)
    register(records, "t1")
    claim(records, "t1", "tok-a")

    # When the turn succeeds with a frame
    ended = records.succeed("t1", NS, "tok-a", frame=FRAME_2, result=RESULT, ttl_s=3600)

    # Then the frame is appended and the envelope left as it was
    assert ended == Ended(True, None)
    assert client.get(k.conversation(NS)) == ENVELOPE
    assert client.lrange(k.conversation_frames(NS), 0, -1) == [FRAME_1, FRAME_2]
    assert record(records, "t1").state is TurnState.SUCCEEDED


def test_succeed_with_an_envelope_compacts_the_conversation(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a stored conversation with frames, and its next turn running
    k = shard(records)
    client.set(k.conversation(NS), b"old")
    client.rpush(k.conversation_frames(NS), FRAME_1, FRAME_2)
    register(records, "t1")
    claim(records, "t1", "tok-a")

    # When the turn succeeds with a whole envelope
    assert succeed(records, "t1", "tok-a").ended

    # Then the envelope is replaced and the frames are gone
    assert client.get(k.conversation(NS)) == ENVELOPE
    assert not client.exists(k.conversation_frames(NS))


def test_succeed_under_a_wrong_token_appends_no_frame(
    records: TurnRecords, client: redis.Redis
) -> None:
    k = shard(records)
    client.set(k.conversation(NS), ENVELOPE)
    register(records, "t1")
    claim(records, "t1", "tok-a")
    ended = records.succeed("t1", NS, "tok-x", frame=FRAME_1, result=RESULT, ttl_s=3600)
    assert ended == Ended(False)
    assert not client.exists(k.conversation_frames(NS))


def test_succeed_takes_an_envelope_or_a_frame(records: TurnRecords) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    for written in ({}, {"envelope": ENVELOPE, "frame": FRAME_1}):
        with pytest.raises(ValueError, match="envelope or as a frame"):
            records.succeed("t1", NS, "tok-a", result=RESULT, ttl_s=3600, **written)
    assert record(records, "t1").state is TurnState.RUNNING


def test_succeed_of_the_last_turn_names_no_next_head(records: TurnRecords) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert succeed(records, "t1", "tok-a") == Ended(True, None)


def test_succeed_under_a_wrong_token_is_lost(records: TurnRecords, client: redis.Redis) -> None:
    # Given a running turn with a checkpoint
    register(records, "t1")
    claim(records, "t1", "tok-a")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=CHECKPOINT_1, iteration=1)

    # When a writer with another token succeeds it
    ended = succeed(records, "t1", "tok-x")

    # Then nothing is written: no conversation, still running with its checkpoint, no expiry
    assert ended == Ended(False)
    k = shard(records)
    assert client.get(k.conversation(NS)) is None
    turn = record(records, "t1")
    assert (turn.state, turn.frames) == (TurnState.RUNNING, (CHECKPOINT_1,))
    assert client.ttl(k.turn("t1")) == -1
    assert records.lease_holder(NS) == "t1"


# -- retry ---------------------------------------------------------------------------------------


def test_retry_parks_the_turn_until_server_time_plus_the_delay(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a running turn
    register(records, "t1")
    claim(records, "t1", "tok-a")
    k = shard(records)
    before = records.server_time_ms()

    # When its attempt fails with a resumable error and a 5 s backoff
    due = retry(records, "t1", "tok-a", delay_ms=5000)
    after = records.server_time_ms()

    # Then it waits until the server's now + 5 s, with its checkpoint and error, no lease
    assert before + 5000 <= due <= after + 5000
    turn = record(records, "t1")
    assert turn.state is TurnState.WAITING
    assert turn.due_at_ms == due
    assert (turn.attempt, turn.deliveries) == (2, 0)
    assert turn.checkpoint == CHECKPOINT_1
    assert turn.last_error == "ProviderHTTPError: HTTP 503"
    assert turn.first_failed_at_ms == due - 5000
    assert turn.token == ""
    assert score(client, k.retries, "t1") == due
    assert score(client, k.running, "t1") is None
    assert records.lease_holder(NS) is None


def test_a_second_retry_keeps_the_first_failure_time(records: TurnRecords) -> None:
    # Given a turn that failed once and was claimed again
    register(records, "t1")
    claim(records, "t1", "tok-a")
    first_due = retry(records, "t1", "tok-a", delay_ms=20)
    first_failed = record(records, "t1").first_failed_at_ms
    wait_until(lambda: records.server_time_ms() >= first_due + 5, 5, "the retry to be due")
    claim(records, "t1", "tok-b")

    # When it fails again
    second_due = retry(records, "t1", "tok-b", delay_ms=1000, attempt=3)

    # Then the first failure time stays, the due time is the new one
    turn = record(records, "t1")
    assert turn.first_failed_at_ms == first_failed
    assert turn.due_at_ms == second_due > first_due
    assert turn.attempt == 3


def test_retry_under_a_wrong_token_is_refused(records: TurnRecords, client: redis.Redis) -> None:
    # Given a running turn
    register(records, "t1")
    claim(records, "t1", "tok-a")

    # When a writer with another token schedules a retry
    due = retry(records, "t1", "tok-x", delay_ms=1000)

    # Then nothing changes: still running under its lease, not in the retry index
    assert due == 0
    turn = record(records, "t1")
    assert (turn.state, turn.token, turn.attempt, turn.due_at_ms) == (
        TurnState.RUNNING,
        "tok-a",
        1,
        0,
    )
    assert score(client, shard(records).retries, "t1") is None
    assert records.lease_holder(NS) == "t1"


# -- dead_letter ---------------------------------------------------------------------------------


def test_dead_letter_files_the_entry_and_ends_the_turn(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a turn that failed once (first failure at the server's time), runs again, and has
    # a second turn queued behind it last woken long ago; its record had an expiry set
    register(records, "t1")
    register(records, "t2")
    claim(records, "t1", "tok-a")
    due = retry(records, "t1", "tok-a", delay_ms=20)
    first_failed = record(records, "t1").first_failed_at_ms
    wait_until(lambda: records.server_time_ms() >= due + 5, 5, "the retry to be due")
    claim(records, "t1", "tok-b")
    k = shard(records)
    client.zadd(k.pending, {"t2": 1})
    client.expire(k.turn("t1"), 3600)
    before = records.server_time_ms()

    # When its worker dead-letters it with its last checkpoint
    ended = dead_letter(records, "t1", "tok-b", checkpoint=CHECKPOINT_2)
    after = records.server_time_ms()

    # Then the entry summary is filed with the server's failure times
    assert ended == Ended(True, "t2", "demo")
    raw = client.hget(k.dead_letters, "dl-t1")
    assert raw is not None
    entry = orjson.loads(raw)
    assert entry["id"] == "dl-t1" and entry["reason"] == "non_resumable"
    assert entry["firstFailedAtMs"] == first_failed
    assert before <= entry["lastFailedAtMs"] <= after
    assert score(client, k.dead_letter_index, "dl-t1") == entry["lastFailedAtMs"]
    # and the record is dead-lettered with the checkpoint, kept as long as the entry
    turn = record(records, "t1")
    assert turn.state is TurnState.DEAD_LETTERED
    assert (turn.dlq_id, turn.reason, turn.checkpoint) == ("dl-t1", "non_resumable", CHECKPOINT_2)
    assert turn.finished_at_ms == entry["lastFailedAtMs"]
    assert client.ttl(k.turn("t1")) == -1
    # and it is off the queue and the live indices, and the next head is woken now
    assert client.lrange(k.queue(NS), 0, -1) == [b"t2"]
    assert score(client, k.running, "t1") is None
    assert not client.exists(k.lease(NS))
    woken = score(client, k.pending, "t2")
    assert woken is not None and before <= woken <= after


def test_dead_letter_of_a_turn_that_never_failed_before_uses_now_for_both_times(
    records: TurnRecords, client: redis.Redis
) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert dead_letter(records, "t1", "tok-a").ended
    entry = orjson.loads(client.hget(shard(records).dead_letters, "dl-t1") or b"{}")
    assert entry["firstFailedAtMs"] == entry["lastFailedAtMs"] > 0
    # No checkpoint given: the record keeps none (it had none).
    assert record(records, "t1").checkpoint == b""


def test_dead_letter_of_an_ended_turn_is_done_and_files_nothing(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a turn that succeeded
    register(records, "t1")
    claim(records, "t1", "tok-a")
    succeed(records, "t1", "tok-a")

    # When something tries to dead-letter it, even without a token
    ended = dead_letter(records, "t1", "")

    # Then it is refused as done: no entry, the record still succeeded
    assert ended == Ended(False)
    assert client.hlen(shard(records).dead_letters) == 0
    assert record(records, "t1").state is TurnState.SUCCEEDED


def test_a_never_claimed_turn_is_dead_lettered_with_an_empty_token(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a bad payload's turn: recorded without a namespace, never claimed
    register(records, "bad", namespace="")
    k = shard(records, "")

    # When its worker dead-letters it with token ''
    ended = dead_letter(records, "bad", "", namespace="")

    # Then it is filed and ended, and off the pending index
    assert ended == Ended(True, None)
    assert client.hexists(k.dead_letters, "dl-bad")
    assert record(records, "bad", "").state is TurnState.DEAD_LETTERED
    assert score(client, k.pending, "bad") is None


def test_dead_letter_under_a_wrong_token_is_lost(records: TurnRecords, client: redis.Redis) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert dead_letter(records, "t1", "tok-x") == Ended(False)
    assert client.hlen(shard(records).dead_letters) == 0
    assert record(records, "t1").state is TurnState.RUNNING


# -- take_due ------------------------------------------------------------------------------------


def test_take_due_returns_what_is_due_by_the_server_clock_and_bumps_it(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a retry index with one turn due a second ago and one due in a minute
    register(records, "t1")
    k = shard(records)
    now = records.server_time_ms()
    client.zadd(k.retries, {"t1": now - 1000, "later": now + 60_000})

    # When a pump takes what is due, bumping it 5 s
    taken = records.take_due(k, k.retries, limit=10, bump_ms=5000)
    after = records.server_time_ms()

    # Then only the due turn comes back, with the namespace from its record, pushed 5 s on
    assert [(d.turn_id, d.namespace) for d in taken] == [("t1", NS)]
    bumped = score(client, k.retries, "t1")
    assert bumped is not None and now + 5000 <= bumped <= after + 5000
    assert score(client, k.retries, "later") == now + 60_000
    # and another pump right after finds nothing to take
    assert records.take_due(k, k.retries, limit=10, bump_ms=5000) == []


def test_take_due_with_a_lag_takes_only_what_is_older_than_the_lag(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given pending turns last woken 2 s and 20 s ago by the server's clock
    k = shard(records)
    now = records.server_time_ms()
    client.zadd(k.pending, {"recent": now - 2000, "stalled": now - 20_000})

    # When the pump takes those stalled for 10 s
    taken = records.take_due(k, k.pending, limit=10, bump_ms=10_000, lag_ms=10_000)

    # Then only the one woken 20 s ago; a turn without a record has namespace ''
    assert [(d.turn_id, d.namespace) for d in taken] == [("stalled", "")]
    assert score(client, k.pending, "recent") == now - 2000


def test_take_due_takes_at_most_limit(records: TurnRecords, client: redis.Redis) -> None:
    k = shard(records)
    now = records.server_time_ms()
    client.zadd(k.retries, {"a": now - 3000, "b": now - 2000, "c": now - 1000})
    first = records.take_due(k, k.retries, limit=2, bump_ms=60_000)
    assert [d.turn_id for d in first] == ["a", "b"]
    assert [d.turn_id for d in records.take_due(k, k.retries, limit=2, bump_ms=60_000)] == ["c"]


# -- lease_holder, worker_beat -------------------------------------------------------------------


def test_lease_holder_names_the_running_turn(records: TurnRecords) -> None:
    # A turn id may itself hold the separator of the lease value.
    register(records, "odd|id")
    assert records.lease_holder(NS) is None
    claim(records, "odd|id", "tok-a")
    assert records.lease_holder(NS) == "odd|id"
    succeed(records, "odd|id", "tok-a")
    assert records.lease_holder(NS) is None


def test_worker_beat_stamps_the_server_time_and_the_prefetched_turns(
    records: TurnRecords, client: redis.Redis
) -> None:
    # When a worker beats, holding one turn prefetched
    received = [["t9", NS]]
    before = records.server_time_ms()
    beat = records.script("worker_beat")
    beat(keys=[records.keys.workers], args=["w1@host", orjson.dumps(received), 8])
    after = records.server_time_ms()

    # Then its entry in the presence hash has the server's time and those turns
    raw = client.hget(records.keys.workers, "w1@host")
    assert raw is not None
    entry = orjson.loads(raw)
    assert before <= entry["at"] <= after
    assert entry["received"] == received
    assert entry["slots"] == 8  # the fairness gate's window counts them

    # and the next beat replaces it
    time.sleep(0.01)
    beat(keys=[records.keys.workers], args=["w1@host", b"[]", 8])
    entry = orjson.loads(client.hget(records.keys.workers, "w1@host") or b"{}")
    assert entry["received"] == [] and entry["at"] >= after


# -- handover (a worker shutting down) -----------------------------------------------------------


def events(client: redis.Redis, records: TurnRecords, turn_id: str) -> list[dict[str, Any]]:
    entries: Any = client.xrange(shard(records).events(turn_id))
    return [
        {"type": f[b"type"].decode(), "at": int(f[b"at"]), **orjson.loads(f[b"data"])}
        for _, f in entries
    ]


def test_handover_releases_the_lease_and_the_next_claim_goes_on_with_the_same_delivery(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a turn running under worker A's 30 s lease, round 1 persisted, a turn behind it
    register(records, "t1")
    register(records, "t2")
    claim(records, "t1", "tok-a", worker="w1@host")
    records.renew("t1", NS, "tok-a", LEASE_S, frame=CHECKPOINT_1, iteration=2)
    k = shard(records)
    before = records.server_time_ms()

    # When A, shutting down, hands it over
    woken = records.hand_over("t1", NS, "tok-a", worker="w1@host", reason="shutdown")
    after = records.server_time_ms()

    # Then the lease is gone at once and the turn is queued again at the head, with its
    # checkpoint, out of the running index and in the pending one (the pump's safety net)
    assert woken == Due("t1", NS, "demo", "c-1")
    assert client.exists(k.lease(NS)) == 0
    turn = record(records, "t1")
    assert turn.state is TurnState.QUEUED
    assert (turn.frames, turn.iteration, turn.token, turn.handovers) == ((CHECKPOINT_1,), 2, "", 1)
    assert before <= turn.updated_at_ms <= after
    assert client.lrange(k.queue(NS), 0, -1) == [b"t1", b"t2"]
    assert score(client, k.running, "t1") is None
    assert score(client, k.pending, "t1") == turn.updated_at_ms
    # and the event says so, in the same step, on the server's clock
    last = events(client, records, "t1")[-1]
    assert last == {
        "type": "turn.handed_over",
        "at": turn.updated_at_ms,
        "worker": "w1@host",
        "reason": "shutdown",
    }

    # When worker B claims it, no lease later
    taken = claim(records, "t1", "tok-b", worker="w2@host")

    # Then it starts from the checkpoint, and the start is not a redelivery: a deploy does not
    # push a turn toward poison
    assert taken.status is ClaimStatus.CLAIMED and taken.record is not None
    assert taken.record.frames == (CHECKPOINT_1,)
    assert (taken.record.deliveries, taken.record.redeliveries) == (1, 0)
    assert (taken.record.worker, taken.record.handovers) == ("w2@host", 1)
    # but a crash after it counts as one, as always
    client.delete(k.lease(NS))
    crashed = claim(records, "t1", "tok-c", worker="w3@host")
    assert crashed.record is not None
    assert (crashed.record.deliveries, crashed.record.redeliveries) == (2, 1)


def test_handover_under_a_wrong_token_changes_nothing(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given worker B took a turn over from A, whose lease ran out
    register(records, "t1")
    claim(records, "t1", "tok-a", lease_ttl_s=SHORT_LEASE_S)
    k = shard(records)
    wait_until(lambda: not client.exists(k.lease(NS)), 5, "A's lease to run out")
    claim(records, "t1", "tok-b", worker="w2@host")
    before = record(records, "t1")

    # When A, shutting down, tries to hand it over (at a check point, or its grace ran out)
    woken = records.hand_over("t1", NS, "tok-a", worker="w1@host", reason="grace_expired")

    # Then it is refused: B keeps the turn and its lease, no event is written
    assert woken is None
    assert record(records, "t1") == before
    assert client.get(k.lease(NS)) == b"t1|tok-b"
    assert "turn.handed_over" not in [e["type"] for e in events(client, records, "t1")]


def test_an_ended_turn_cannot_be_handed_over(records: TurnRecords) -> None:
    register(records, "t1")
    claim(records, "t1", "tok-a")
    assert succeed(records, "t1", "tok-a").ended
    assert records.hand_over("t1", NS, "tok-a", worker="w1@host", reason="shutdown") is None
    assert record(records, "t1").state is TurnState.SUCCEEDED


# -- one hash slot per conversation --------------------------------------------------------------


@dataclass
class ScriptCall:
    name: str
    keys: list[str]  # the KEYS the call passed
    touched: list[str]  # the keys its Lua commands touched (read with MONITOR)


class WatchedRecords(TurnRecords):
    """TurnRecords whose script calls are recorded: what they pass and what they touch."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client, Keys(PREFIX, SHARDS))
        self.client = client
        self.calls: list[ScriptCall] = []

    def script(self, name: str) -> Any:
        inner = super().script(name)

        def call(keys: list[str], args: list[Any]) -> Any:
            with self.client.monitor() as monitor:
                reply = inner(keys=keys, args=args)
                touched = lua_keys(self.client, monitor)
            self.calls.append(ScriptCall(name, [str(key) for key in keys], touched))
            return reply

        return call


def lua_keys(client: redis.Redis, monitor: Monitor) -> list[str]:
    """The keys of every command Lua ran that `monitor` saw, up to a sentinel we send now.
    The server says which arguments are keys (COMMAND GETKEYS)."""
    sentinel = f"sentinel-{uuid.uuid4().hex}"
    client.echo(sentinel)
    keys: list[str] = []
    while True:
        raw = monitor.connection.read_response()
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        match = Monitor.monitor_re.match(text.split(" ", 1)[1])
        assert match is not None, text
        _, source, command = match.groups()
        # MONITOR quotes each argument and escapes quotes, backslashes and non-ASCII bytes.
        args = [codecs.escape_decode(arg)[0] for arg in Monitor.command_re.findall(command)]
        if args == [b"ECHO", sentinel.encode()]:
            return keys
        if source != "lua":
            continue
        try:
            found = client.command_getkeys(*args)
        except redis.ResponseError:  # TIME and other commands without keys
            continue
        keys += [key.decode() if isinstance(key, bytes) else key for key in found]


def lifecycle(records: TurnRecords, namespace: str) -> None:
    """Every script, through TurnRecords, for one conversation."""
    k = records.keys.for_namespace(namespace)
    assert register(records, "t1", namespace) is Registered.CREATED
    assert register(records, "t1", namespace) is Registered.EXISTS
    assert register(records, "t2", namespace) is Registered.CREATED
    assert register(records, "t3", namespace) is Registered.CREATED
    records.unregister("t3", namespace)
    assert claim(records, "t2", namespace=namespace).status is ClaimStatus.NOT_HEAD
    assert claim(records, "t1", "tok-a", namespace=namespace).status is ClaimStatus.CLAIMED
    assert claim(records, "t1", "tok-b", namespace=namespace).status is ClaimStatus.BUSY
    assert records.renew("t1", namespace, "tok-a", LEASE_S)
    assert records.renew("t1", namespace, "tok-a", LEASE_S, frame=CHECKPOINT_1, iteration=1)
    assert not records.renew("t1", namespace, "tok-x", LEASE_S)
    assert records.lease_holder(namespace) == "t1"
    assert records.schedule_retry(
        "t1",
        namespace,
        "tok-a",
        delay_ms=0,
        next_attempt=2,
        checkpoint=CHECKPOINT_1,
        error="e",
    )
    for index in (k.retries, k.running, k.pending, k.finished):
        records.take_due(k, index, limit=10, bump_ms=1000)
    assert claim(records, "t1", "tok-c", namespace=namespace).status is ClaimStatus.CLAIMED
    assert records.hand_over("t1", namespace, "tok-c", worker="w1", reason="shutdown")
    assert claim(records, "t1", "tok-c", namespace=namespace).status is ClaimStatus.CLAIMED
    assert succeed(records, "t1", "tok-x", namespace) == Ended(False)
    assert succeed(records, "t1", "tok-c", namespace) == Ended(True, "t2", "demo")
    assert claim(records, "t1", "tok-d", namespace=namespace).status is ClaimStatus.DONE
    claimed = claim(records, "t2", "tok-e", namespace=namespace)
    assert claimed.status is ClaimStatus.CLAIMED and claimed.stored == ENVELOPE
    assert dead_letter(records, "t2", "tok-x", namespace) == Ended(False)
    assert dead_letter(records, "t2", "tok-e", namespace, checkpoint=CHECKPOINT_2).ended
    assert dead_letter(records, "t2", "", namespace) == Ended(False)
    # a turn that appends a conversation frame, and one that ends keeping it with its base
    assert register(records, "t4", namespace) is Registered.CREATED
    assert claim(records, "t4", "tok-f", namespace=namespace).status is ClaimStatus.CLAIMED
    ended = records.succeed("t4", namespace, "tok-f", frame=FRAME_1, result=RESULT, ttl_s=60)
    assert ended.ended
    assert register(records, "t5", namespace) is Registered.CREATED
    claimed = claim(records, "t5", "tok-g", namespace=namespace)
    assert claimed.stored_frames == (FRAME_1,)
    assert records.renew("t5", namespace, "tok-g", LEASE_S, frame=b"f1", iteration=1)
    assert dead_letter(records, "t5", "tok-g", namespace).ended
    assert record(records, "t5", namespace).base_frames == (orjson.loads(FRAME_1),)
    assert claim(records, "gone", namespace=namespace).status is ClaimStatus.MISSING


SCRIPTS = {
    "register",
    "unregister",
    "claim",
    "progress",
    "retry",
    "succeed",
    "dead_letter",
    "take_due",
    "lease_holder",
    "handover",
}


@pytest.mark.parametrize(
    "conversation_id",
    ["c-42", "{c-42}", "}{", "a}b{c", "{}", "{0}", "{{x}}", "with space {1}", "ü/ö%{"],
)
def test_every_key_of_one_conversation_hashes_to_one_slot(
    client: redis.Redis, conversation_id: str
) -> None:
    # Given a conversation whose id may hold hash-tag braces
    namespace = f"acme/u-1/{conversation_id.replace('%', '%25').replace('/', '%2F')}"
    records = WatchedRecords(client)
    shard_slot = key_slot(records.keys.for_namespace(namespace).tag.encode())

    # When every script runs for it
    lifecycle(records, namespace)

    # Then each call's keys, given and touched, hash to its shard's slot (take_due also reads
    # the records of the turns it takes, named from the index: the same slot), keep the prefix
    # and (for the conversation's own keys) the namespace an operator searches by
    assert {call.name for call in records.calls} == SCRIPTS
    for call in records.calls:
        assert call.keys, call.name
        assert call.touched, call.name
        slots = {key_slot(key.encode()) for key in call.keys + call.touched}
        assert slots == {shard_slot}, (call.name, call.keys, call.touched)
        assert all(key.startswith(f"{PREFIX}:") for key in call.keys + call.touched)
    queue_keys = [key for call in records.calls for key in call.keys if ":queue:" in key]
    assert queue_keys and all(key.endswith(namespace) for key in queue_keys)


def test_conversations_spread_over_the_shards(client: redis.Redis) -> None:
    # The sharded indices are not one slot for everything: many conversations, many slots.
    keys = Keys(PREFIX, SHARDS)
    slots = {key_slot(keys.for_namespace(f"_/_/c-{n}").retries.encode()) for n in range(200)}
    assert len(slots) == SHARDS


def test_a_script_the_server_forgot_is_loaded_again(
    records: TurnRecords, client: redis.Redis
) -> None:
    # Given a script the server has run (TurnRecords sends EVALSHA as a command of its own)
    assert register(records, "t1") is Registered.CREATED
    # When the server forgets its scripts (a restart without persistence, a failover)
    client.script_flush()
    # Then the next call loads the script and runs it
    assert register(records, "t2") is Registered.CREATED
    assert register(records, "t1") is Registered.EXISTS
    assert client.script_exists(records.script("register").sha) == [True]
