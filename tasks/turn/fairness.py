"""Tenant fairness (docs/platform.md, "Budgets and fairness"): runnable turns of different
tenants start in weighted round-robin, not in submission order, and one tenant's running turns
stay under its cap, while every turn still runs in its conversation's order.

The broker delivers in order, so fairness is decided before a message is published: a gate in
the state store (tasks/store/lua/common.lua, the gate functions) keeps about as many turns
published and unclaimed as the workers have slots. A turn submitted beyond that, or whose tenant
is at its cap (AGENTJOBS_TENANT_MAX_RUNNING) or has turns held already, is held in its tenant's
list, recorded and `queued`, with no message and no worker. Each claim frees its place, and the
claim script admits the next held turns in smooth weighted round-robin over the tenants
(AGENTJOBS_TENANT_WEIGHTS), which the claiming worker publishes; the pump fills what claims do
not (a cap that frees when a turn ends), sizes the window from the workers' heartbeats, and mends
counts a crash left behind. A retry, the next turn of a conversation and a person's decision
start without the window (their turns were admitted once) and are counted when they start;
when their tenant is at its cap then, the claim holds them in the tenant's list instead, for
the gate to publish again as a place frees (common.lua, gate_hold_capped), so a cap is never
exceeded.

The gate's steps run inside the scripts that register, claim and end turns, so with no contention
fairness costs a few Redis commands and no round trip. Its keys are in no shard's hash slot: on a
Redis Cluster it is off, and turns start in submission order.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import redis

from tasks.queue.context import JobContext
from tasks.turn import ending

logger = logging.getLogger("agentjobs.fairness")

# The most held turns the pump admits in one tick.
FILL_BATCH = 200
# An admitted turn whose message no worker claimed for this long stops holding a place.
STALE_UNCLAIMED_MS = 60_000
# Extra places beyond the workers' slots, so a slot that frees finds a message waiting.
WINDOW_SLACK = 2
WINDOW_TTL_S = 60


def publish_released(ctx: JobContext, refs: list[Any]) -> int:
    """Publish the held turns the gate admitted (refs as common.lua writes them)."""
    for raw in refs:
        try:
            # A turn held at its claim (a retry, a next turn) also says its attempt.
            _turn_key, _pending, turn_id, namespace, agent, conversation_id, *rest = orjson.loads(
                raw
            )
            attempt = int(rest[0]) if rest else 1
        except (orjson.JSONDecodeError, ValueError, TypeError):
            logger.warning("fairness gate: an unreadable held turn was dropped: %r", raw[:200])
            continue
        ending.wake(ctx, turn_id, namespace, agent, conversation_id, attempt=attempt)
    return len(refs)


def slots(ctx: JobContext) -> int:
    """The worker slots of the live workers' heartbeats (tasks/turn/worker.py)."""
    now_ms = ctx.records.server_time_ms()
    alive_ms = int(ctx.settings.lease_ttl_s * 1000)
    total = 0
    workers: dict[bytes, bytes] = ctx.redis.hgetall(ctx.keys.workers)  # type: ignore[assignment]
    for raw in workers.values():
        try:
            beat = orjson.loads(raw)
            if int(beat["at"]) > now_ms - alive_ms:
                total += int(beat.get("slots") or 0)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return total


def pump_gate(ctx: JobContext, *, sweep: bool) -> int:
    """The pump's part: size the window, admit what claims left, and (`sweep`) mend counts.
    -> how many held turns it released."""
    gate = ctx.records.gate[0]
    if not gate:
        return 0
    found = slots(ctx)
    # One round trip, and no script while nothing is held or counted (an idle pump).
    with ctx.redis.pipeline(transaction=False) as pipe:
        if found:
            pipe.set(f"{gate}:window", found + WINDOW_SLACK, ex=WINDOW_TTL_S)
        pipe.exists(f"{gate}:active")
        pipe.exists(f"{gate}:owners", f"{gate}:unclaimed")
        *_, held, counted = pipe.execute()
    if sweep and counted:
        ctx.records.gate_sweep(STALE_UNCLAIMED_MS, 1000)
    if not held:
        return 0
    return publish_released(ctx, ctx.records.gate_fill(FILL_BATCH))


def held_counts(ctx: JobContext) -> dict[str, int]:
    """Turns held per tenant ('' for none), for `agentjobs stats` and the console."""
    gate, _ = ctx.records.gate
    if not gate:
        return {}
    try:
        tenants = [t.decode() for t in ctx.redis.hkeys(f"{gate}:active")]  # type: ignore[union-attr]
        with ctx.redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.llen(f"{gate}:held:{tenant}")
            return dict(zip(tenants, pipe.execute(), strict=True))
    except redis.RedisError:
        return {}
