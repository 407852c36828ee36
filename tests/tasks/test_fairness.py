"""Tenant fairness against real workers and a real Redis (docs/platform.md, "Budgets and
fairness"): a tenant's backlog does not hold another tenant's later turns behind it, weights
share the workers, a running cap holds, and each conversation keeps its order."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from tasks import run_turn, turn_status
from tasks.core.namespaces import namespace_for
from tasks.core.schema import ClaimStatus
from tasks.queue.context import job_context
from tasks.testing import wait_until
from tests.tasks.budget_agents import LOG_KEY
from tests.tasks.conftest import TEST_AGENTS, Jobs

pytestmark = pytest.mark.integration

AGENTS = {**TEST_AGENTS, "metered": "tests.tasks.budget_agents:build_metered_agent"}


def _env(**settings: str) -> dict[str, str]:
    agents = ",".join(f"{name}={target}" for name, target in AGENTS.items())
    return {"AGENTJOBS_AGENTS": agents, **settings}


def submit(tenant: str, n: int, *, conversations: int | None = None) -> list[Any]:
    return [
        run_turn.delay(
            agent="metered",
            conversation_id=f"{tenant}-{i % (conversations or n)}",
            message=f"{tenant} {i}",
            identity={"tenant": tenant},
        )
        for i in range(n)
    ]


def calls(jobs: Jobs) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in jobs.redis.lrange(LOG_KEY, 0, -1)]


def test_a_later_tenant_is_not_stuck_behind_a_backlog(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_TEST_CALL_S="0.05", AGENTJOBS_TENANT_FAIRNESS="1"))
    jobs.worker(concurrency=4)
    jobs.pump()
    flood = submit("acme", 120)
    # Held, not published: the broker holds about as many turns as the workers have slots.
    wait_until(lambda: calls(jobs), 20, "the first calls")
    later = submit("beta", 4)
    for result in later:
        result.get(timeout=60)
    done_before = sum(1 for e in calls(jobs) if e["text"].startswith("acme"))
    # beta's four turns ran within a few rounds of the workers' slots, not behind 120.
    assert done_before < 50, f"{done_before} of acme's turns ran before beta's four finished"
    for result in flood:
        result.get(timeout=120)
    assert len(calls(jobs)) == 124


def test_weights_share_the_workers(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(
        **_env(AGENTJOBS_TEST_CALL_S="0.05", AGENTJOBS_TENANT_WEIGHTS="acme=3,beta=1")
    )
    # No worker yet: everything beyond the window is held, then both tenants compete.
    acme, beta = submit("acme", 60), submit("beta", 60)
    jobs.worker(concurrency=4)
    jobs.pump()
    for result in [*acme, *beta]:
        result.get(timeout=120)
    texts = [e["text"] for e in sorted(calls(jobs), key=lambda e: e["start"])]
    # The first 16 turns started were the gate's first window (published in submission
    # order); the next 40, released in turn: about three of acme's to each of beta's.
    middle = texts[16:56]
    share = sum(1 for t in middle if t.startswith("acme")) / len(middle)
    assert 0.65 <= share <= 0.85, (share, middle)


def test_a_running_cap_holds_across_workers(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(
        **_env(AGENTJOBS_TEST_CALL_S="0.2", AGENTJOBS_TENANT_MAX_RUNNING="acme=2,*=8")
    )
    jobs.worker(concurrency=4)
    jobs.worker(concurrency=4)
    jobs.pump()
    capped = submit("acme", 8)
    free = submit("beta", 4)
    for result in [*capped, *free]:
        result.get(timeout=60)
    log = calls(jobs)

    def most_at_once(tenant: str) -> int:
        spans = [(e["start"], e["at"]) for e in log if e["text"].startswith(tenant)]
        return max(sum(1 for s, a in spans if s <= start < a) for start, _ in spans)

    assert most_at_once("acme") <= 2
    assert most_at_once("beta") >= 2  # the cap is acme's alone
    # Nothing is left counted once every turn ended.
    gate = job_context().records.gate[0]
    assert jobs.redis.hgetall(f"{gate}:inflight") == {}


def test_a_conversation_keeps_its_order_through_the_gate(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_TENANT_MAX_RUNNING="acme=1"))
    jobs.worker(concurrency=4)
    jobs.pump()
    turns = submit("acme", 12, conversations=3)
    for result in turns:
        result.get(timeout=60)
    for conversation in range(3):
        mine = [e for e in calls(jobs) if int(e["text"].split()[1]) % 3 == conversation]
        numbers = [int(e["text"].split()[1]) for e in sorted(mine, key=lambda e: e["start"])]
        assert numbers == sorted(numbers)
    statuses = [turn_status(t.id) for t in turns]
    assert all(s is not None and s.state == "succeeded" for s in statuses)


def test_retries_and_next_turns_keep_under_the_cap(make_jobs: Any) -> None:
    # Retries, the next turn of a conversation and decided pauses start without the window;
    # at the tenant's cap their claim holds them for the gate instead of running over it.
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_TENANT_MAX_RUNNING="acme=2"))
    jobs.worker(concurrency=8)
    jobs.pump()
    turns = [
        run_turn.delay(
            agent="demo",
            conversation_id=f"acme-{i % 6}",
            message=f"turn {i} fail:503x1 think:0.2",
            identity={"tenant": "acme"},
        )
        for i in range(12)
    ]
    ctx = job_context()
    keys = []
    for turn in turns:
        record = ctx.records.find(turn.id)
        assert record is not None
        keys.append(ctx.keys.for_namespace(record.namespace).turn(turn.id))
    most = 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        # One MULTI/EXEC: a snapshot of every state at one instant, never torn by a turn that
        # ends and another that starts between two reads.
        with ctx.redis.pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.hget(key, "state")
            states = [raw.decode() if raw else "" for raw in pipe.execute()]
        most = max(most, states.count("running"))
        if all(s == "succeeded" for s in states):
            break
        time.sleep(0.02)
    assert all(t.get(timeout=10)["attempts"] == 2 for t in turns)  # each one retried
    assert 1 <= most <= 2
    gate = job_context().records.gate[0]
    wait_until(lambda: jobs.redis.hgetall(f"{gate}:inflight") == {}, 10, "nothing counted")


def test_a_turn_held_at_its_claim_is_admitted_whatever_its_gate_field_says(
    make_jobs: Any,
) -> None:
    # The scripts alone (no worker): acme may run one turn. The first runs; the next turn of
    # another conversation, claimed meanwhile (as a retry or a next turn is, without the
    # window), is held at its claim, and left in the pump's index should the gate never get to
    # it; once the first ends, the gate admits it, even with a gate field left on its record.
    make_jobs(AGENTJOBS_TENANT_MAX_RUNNING="acme=1")
    ctx = job_context()
    records, gate = ctx.records, ctx.records.gate[0]

    def register(turn_id: str, conversation: str, gated: bool) -> str:
        namespace = namespace_for(conversation, {"tenant": "acme"})
        records.register(
            turn_id,
            payload=b"{}",
            agent="demo",
            conversation_id=conversation,
            namespace=namespace,
            tenant="acme",
            gated=gated,
        )
        return namespace

    first = register("t-first", "c-1", gated=True)
    assert records.claim("t-first", first, "tok-1", 30, "w1").status is ClaimStatus.CLAIMED
    second = register("t-second", "c-2", gated=False)
    shard = ctx.keys.for_namespace(second)
    assert records.claim("t-second", second, "tok-2", 30, "w1").status is ClaimStatus.CAPPED
    ctx.redis.hset(shard.turn("t-second"), "gate", gate)  # a field outliving its count
    assert ctx.redis.zscore(shard.pending, "t-second") is not None
    assert records.gate_fill(10) == []  # acme is at its cap
    assert records.cancel("t-first", first, reason="done", ttl_s=60).ended
    admitted = records.gate_fill(10) + records.gate_fill(10)
    assert [orjson.loads(ref)[2] for ref in admitted] == ["t-second"]
    assert ctx.redis.zscore(shard.pending, "t-second") is not None
    assert records.claim("t-second", second, "tok-3", 30, "w1").status is ClaimStatus.CLAIMED
