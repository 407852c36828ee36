"""What Redis keeps is bounded: a succeeded turn's record keeps its result, not checkpoints the
stored conversation already holds; a dead-letter entry keeps its summary apart from the
checkpoint, so listing entries never reads checkpoints."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from tasks import TurnDeadLettered, run_turn
from tasks.core.keys import Keys
from tasks.queue.context import job_context
from tasks.store.records import TurnRecords
from tasks.testing import RedisServer
from tests.agent.support import wire_checkpoint

pytestmark = pytest.mark.integration


def test_a_succeeded_turn_keeps_its_result_and_no_checkpoint(jobs: Any) -> None:
    result = run_turn.delay(agent="demo", conversation_id="c-bound", message="two rounds:2")
    reply = result.get(timeout=30)
    record = job_context().records.get(result.id)
    assert record is not None and record.state == "succeeded"
    assert record.result == reply
    assert record.checkpoint == b"", "the stored conversation holds the checkpoint already"
    turn_key = job_context().keys.for_namespace(record.namespace).turn(result.id)
    assert 0 < jobs.redis.ttl(turn_key) <= job_context().settings.record_ttl_s


def test_a_dead_letter_stores_the_message_in_its_turn_record_only(jobs: Any) -> None:
    marker = "unique-marker-7f3a"
    result = run_turn.delay(agent="demo", conversation_id="c-dl", message=f"{marker} fail:401")
    with pytest.raises(TurnDeadLettered) as failed:
        result.get(timeout=30)
    ctx = job_context()
    summary = ctx.dead_letters.summary(failed.value.entry_id)
    assert summary is not None and marker not in orjson.dumps(summary).decode()
    entry = ctx.dead_letters.get(failed.value.entry_id)
    assert entry is not None
    assert entry["kwargs"]["message"] == f"{marker} fail:401"
    assert entry["checkpoint"]["history"][0]["content"] == f"{marker} fail:401"
    # The record is kept as long as its entry, whatever the record TTL.
    record = ctx.records.get(result.id)
    assert record is not None
    assert jobs.redis.ttl(ctx.keys.for_namespace(record.namespace).turn(result.id)) == -1


def file_entries(records: TurnRecords, count: int, checkpoint_bytes: int) -> None:
    big = wire_checkpoint(history=[{"role": "user", "content": "x" * checkpoint_bytes}])
    checkpoint = orjson.dumps(big)
    for n in range(count):
        turn_id, namespace = f"t-{n}", f"_/_/c-{n}"
        records.register(
            turn_id, payload=b"{}", agent="a", conversation_id=f"c-{n}", namespace=namespace
        )
        summary = orjson.dumps(
            {
                "id": f"dl-{turn_id}",
                "reason": "max_attempts",
                "taskId": turn_id,
                "namespace": namespace,
            }
        )
        records.dead_letter(
            turn_id,
            namespace,
            "",
            entry_id=f"dl-{turn_id}",
            entry=summary,
            reason="max_attempts",
            checkpoint=checkpoint,
        )


def test_listing_dead_letters_reads_summaries_not_checkpoints(
    redis_server: RedisServer,
) -> None:
    from tasks.store.dead_letters import DeadLetterStore

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    keys = Keys("bounds", 16)
    records = TurnRecords(client, keys)
    store = DeadLetterStore(client, records, 3600)
    file_entries(records, count=200, checkpoint_bytes=50_000)  # 10 MB of checkpoints

    def bytes_sent(action: Any) -> int:
        before = int(client.info("stats")["total_net_output_bytes"])
        action()
        return int(client.info("stats")["total_net_output_bytes"]) - before

    assert store.list_entries(reason="poison") == []
    no_match = bytes_sent(lambda: store.list_entries(reason="poison"))
    listed = bytes_sent(lambda: store.list_entries())
    page = bytes_sent(lambda: store.list_entries(limit=5, bodies=True))
    assert len(store.list_entries()) == 200
    assert no_match < 200_000, f"{no_match} bytes read to find nothing"
    assert listed < 200_000, f"{listed} bytes read to list summaries"
    assert 5 * 50_000 < page < 400_000, "a page with bodies reads those five checkpoints only"
