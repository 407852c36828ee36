"""Turns a page at a time through the shards' `submitted` indices (tasks/operate/listing.py),
on a real Redis with turns registered by the real register script: every turn once, newest
first, across pages and shards, whatever the ties in submission time; each filter; a filtered
page that stops at its budget still says where to go on; expired records skipped and their
entries trimmed by the pump's trim, the kept ones left."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tasks.core.namespaces import namespace_for
from tasks.operate.listing import TurnFilter, page_turns, parse_cursor
from tasks.queue.context import JobContext, job_context
from tasks.store.records import TurnState
from tasks.turn.pump import trim_submitted

pytestmark = pytest.mark.integration


def register(ctx: JobContext, n: int, *, tenant: str, agent: str = "demo") -> str:
    turn_id = f"t-{n:03d}"
    conversation = f"c-{n % 7}"
    ctx.records.register(
        turn_id,
        payload=b'{"message":"hi"}',
        agent=agent,
        conversation_id=conversation,
        namespace=namespace_for(conversation, {"tenant": tenant}),
        tenant=tenant,
    )
    return turn_id


def every_page(ctx: JobContext, where: TurnFilter | None = None, **options: Any) -> list[str]:
    where = where or TurnFilter()
    seen: list[str] = []
    after = None
    for _ in range(100):
        page = page_turns(ctx, where, after=after, **options)
        seen += [r.turn_id for r in page.turns]
        if page.cursor is None:
            return seen
        after = page.cursor
    raise AssertionError("the pages never ended")


def submitted_order(ctx: JobContext, ids: list[str]) -> list[str]:
    """`ids` newest first by the index's own scores (ties by turn id, descending)."""
    scores = {}
    for shard in ctx.keys.all_shards():
        for member, score in ctx.redis.zrange(shard.submitted, 0, -1, withscores=True):  # type: ignore[union-attr]
            scores[member.decode()] = score
    return sorted(ids, key=lambda t: (scores[t], t), reverse=True)


def test_pages_hold_every_turn_once_newest_first(make_jobs: Any) -> None:
    make_jobs()
    ctx = job_context()
    ids = [register(ctx, n, tenant=("acme", "beta")[n % 2]) for n in range(40)]
    listed = every_page(ctx, limit=7)
    assert sorted(listed) == sorted(ids)
    assert listed == submitted_order(ctx, ids)
    assert len({ctx.keys.for_namespace(r.namespace).shard for r in page_turns(ctx).turns}) > 1


def test_filters(make_jobs: Any) -> None:
    jobs = make_jobs()
    ctx = job_context()
    ids = [
        register(ctx, n, tenant=("acme", "beta")[n % 2], agent="a" if n < 10 else "b")
        for n in range(30)
    ]
    for turn_id in ids[:5]:  # ended as succeeded, as far as a listing can tell
        record = ctx.records.find(turn_id)
        assert record is not None
        shard = ctx.keys.for_namespace(record.namespace)
        jobs.redis.hset(shard.turn(turn_id), "state", "succeeded")
        jobs.redis.zrem(shard.pending, turn_id)
    assert sorted(every_page(ctx, TurnFilter(state=TurnState.SUCCEEDED), limit=2)) == ids[:5]
    assert sorted(every_page(ctx, TurnFilter(state=TurnState.QUEUED), limit=4)) == ids[5:]
    assert every_page(ctx, TurnFilter(state=TurnState.PAUSED)) == []
    assert sorted(every_page(ctx, TurnFilter(tenant="beta"))) == ids[1::2]
    assert sorted(every_page(ctx, TurnFilter(agent="a"), limit=3)) == ids[:10]
    one = namespace_for("c-3", {"tenant": "beta"})
    expected = [t for n, t in enumerate(ids) if n % 7 == 3 and n % 2 == 1]
    assert sorted(every_page(ctx, TurnFilter(namespace=one))) == expected
    # A page that looked at its budget of turns without filling up still has a cursor.
    page = page_turns(ctx, TurnFilter(agent="a"), limit=50, budget=5)
    assert page.examined == 5 and page.cursor is not None
    assert sorted(every_page(ctx, TurnFilter(agent="a"), budget=5)) == ids[:10]


def test_a_bad_cursor_is_refused_by_name(make_jobs: Any) -> None:
    make_jobs()
    for bad in ("", "abc", "12", "x:t-1", "12:"):
        with pytest.raises(ValueError, match="cursor"):
            parse_cursor(bad)
    assert parse_cursor("12:t:1") == (12, "t:1")


def test_expired_records_are_skipped_then_trimmed(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_RECORD_TTL_S="1")
    ctx = job_context()
    ids = [register(ctx, n, tenant="acme") for n in range(12)]
    gone = ids[:4]
    for turn_id in gone:  # as an expired record would be
        record = ctx.records.find(turn_id)
        assert record is not None
        jobs.redis.delete(ctx.keys.for_namespace(record.namespace).turn(turn_id))
    assert sorted(every_page(ctx, limit=5)) == ids[4:]
    time.sleep(1.1)  # every entry is now older than a record is kept
    now_ms = ctx.records.server_time_ms()
    dropped = sum(trim_submitted(ctx, shard, now_ms, limit=2) for shard in ctx.keys.all_shards())
    assert dropped == len(gone)
    indexed = {
        m.decode()
        for shard in ctx.keys.all_shards()
        for m in jobs.redis.zrange(shard.submitted, 0, -1)  # type: ignore[union-attr]
    }
    assert indexed == set(ids[4:])  # unfinished turns keep their entries, however old
