"""Deploys hand turns over: a worker told to stop (SIGTERM) takes no more
turns, hands each running turn over at its next check point so that another worker goes on
from its last checkpoint at once, and exits within AGENTJOBS_SHUTDOWN_GRACE_S; a turn stuck in
a tool past the grace is handed over as last persisted when the grace runs out.

No pump runs in these tests: nothing waits for a lease to run out, or for a pump to notice.
Each test prints what it measured (server clock for the turn, this process's for exits).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import orjson
import pytest

from tasks import iter_events, run_turn
from tasks.demo.agents import demo_counter
from tasks.operate.events import TurnEvent
from tasks.queue.context import job_context
from tasks.store.records import TurnRecord, TurnState
from tasks.testing import Process, wait_until

pytestmark = pytest.mark.integration

LEASE_TTL_S = 3.0  # tests/tasks/conftest.py's
# A wake-up reaching the other worker and its claim, on a loaded 2-core machine.
SLACK_S = 1.0


def record_of(turn_id: str) -> TurnRecord:
    record = job_context().records.get(turn_id)
    assert record is not None, f"no turn record for {turn_id}"
    return record


def events_of(turn_id: str) -> list[TurnEvent]:
    return list(iter_events(turn_id, block_s=0.05))


def at_ms(event: TurnEvent) -> int:
    return int(event.at.timestamp() * 1000)


def after(events: list[TurnEvent], event: TurnEvent) -> list[TurnEvent]:
    return events[events.index(event) + 1 :]


def started(turn_id: str, tool_call_id: str) -> bool:
    return any(
        e.type == "tool.started" and e.data["toolCallId"] == tool_call_id
        for e in events_of(turn_id)
    )


def tool_runs() -> dict[int, int]:
    """Executions of the demo tool by round, over every turn (the tool counts them in Redis)."""
    ctx = job_context()
    runs: dict[int, int] = {}
    for key in ctx.redis.scan_iter(match=demo_counter("tool:*")):
        counts: Any = ctx.redis.hgetall(key)
        for round_, count in counts.items():
            runs[int(round_)] = runs.get(int(round_), 0) + int(count)
    return runs


def terminate(worker: Process) -> float:
    """SIGTERM the worker (a deploy); returns when it was sent (monotonic)."""
    sent = time.monotonic()
    os.kill(worker.pid, signal.SIGTERM)
    return sent


def exited_after_s(worker: Process, sent: float, timeout_s: float) -> float:
    worker.popen.wait(timeout=timeout_s)
    return time.monotonic() - sent


def running_on(workers: dict[str, Process], turn_id: str) -> tuple[Process, Process]:
    """(the worker running the turn, the other one)."""
    name = record_of(turn_id).worker.split("@", 1)[0]
    (other,) = (w for n, w in workers.items() if n != name)
    return workers[name], other


def test_a_running_turn_is_handed_over_at_its_next_check_point(make_jobs: Any) -> None:
    # Given two workers, one of them in round 1 of a turn of three 2 s tool rounds
    grace_s = 10.0
    jobs = make_jobs(AGENTJOBS_SHUTDOWN_GRACE_S=f"{grace_s:g}")
    workers = {name: jobs.worker(name=name) for name in ("w1", "w2")}
    message = "where is my order? rounds:3 slow:2"
    result = run_turn.delay(agent="demo", conversation_id="deploy-1", message=message)
    wait_until(lambda: started(result.id, "call_1"), 30, "round 1's tool to start")
    victim, survivor = running_on(workers, result.id)
    records = job_context().records

    # When that worker is told to stop, as a deploy does
    term_ms = records.server_time_ms()
    sent = terminate(victim)

    # Then it finishes the tool in flight, persists round 1 and hands the turn over at the
    # next model call; it exits right after, not when the turn ends
    exit_s = exited_after_s(victim, sent, timeout_s=grace_s + 5)
    assert victim.popen.returncode == 0
    reply = result.get(timeout=30)
    assert reply["content"] == f"Done: {message}"
    events = events_of(result.id)
    (handed,) = [e for e in events if e.type == "turn.handed_over"]
    assert handed.data["reason"] == "shutdown"
    assert handed.data["worker"].startswith(f"{victim.name}@")
    assert handed.iteration == 2, "handed over with round 1 persisted"
    # and the other worker starts it at once, from that checkpoint: round 2's tool is next
    restart = after(events, handed)[0]
    assert restart.type == "turn.started"
    assert restart.data["worker"].startswith(f"{survivor.name}@")
    tools_after = [e.data["toolCallId"] for e in after(events, restart) if e.type == "tool.started"]
    assert tools_after == ["call_2", "call_3"]
    delay_s = (at_ms(restart) - at_ms(handed)) / 1000
    print(
        f"\nhanded over {(at_ms(handed) - term_ms) / 1000:.2f} s after SIGTERM (the tool in "
        f"flight had up to 2 s left); started on {survivor.name} {delay_s:.3f} s after the "
        f"handover (lease {LEASE_TTL_S:g} s); {victim.name} exited {exit_s:.2f} s after "
        f"SIGTERM (grace {grace_s:g} s)"
    )
    assert delay_s < SLACK_S < LEASE_TTL_S
    assert exit_s < (at_ms(handed) - term_ms) / 1000 + 2 * SLACK_S < grace_s
    # Completed iterations never ran again, and the turn ended once, on the same delivery
    assert tool_runs() == {1: 1, 2: 1, 3: 1}
    record = record_of(result.id)
    assert record.state is TurnState.SUCCEEDED
    assert record.worker.startswith(f"{survivor.name}@")
    assert (record.attempt, record.handovers) == (1, 1)
    assert (record.deliveries, record.redeliveries) == (1, 0), "a handover is no redelivery"
    assert [e.type for e in events].count("turn.succeeded") == 1
    assert survivor.alive()


def test_a_turn_stuck_in_a_tool_is_handed_over_when_the_grace_runs_out(make_jobs: Any) -> None:
    # Given two workers, one of them in round 2 of a turn whose tools take 4 s each, and a
    # shutdown grace of 2 s: the tool cannot reach a check point in time
    grace_s = 2.0
    jobs = make_jobs(AGENTJOBS_SHUTDOWN_GRACE_S=f"{grace_s:g}")
    workers = {name: jobs.worker(name=name) for name in ("w1", "w2")}
    message = "where is my order? rounds:2 slow:4"
    result = run_turn.delay(agent="demo", conversation_id="deploy-2", message=message)
    wait_until(lambda: started(result.id, "call_2"), 30, "round 2's tool to start")
    victim, survivor = running_on(workers, result.id)
    records = job_context().records

    # When that worker is told to stop
    term_ms = records.server_time_ms()
    sent = terminate(victim)

    # Then it exits when the grace runs out, having handed the turn over as last persisted
    exit_s = exited_after_s(victim, sent, timeout_s=grace_s + 10)
    assert victim.popen.returncode == 0
    assert "shutdown grace of 2 s ran out: handed over 1 turns" in victim.log()
    reply = result.get(timeout=30)
    assert reply["content"] == f"Done: {message}"
    events = events_of(result.id)
    (handed,) = [e for e in events if e.type == "turn.handed_over"]
    assert handed.data["reason"] == "grace_expired"
    assert handed.data["worker"].startswith(f"{victim.name}@")
    restart = after(events, handed)[0]
    assert restart.type == "turn.started"
    assert restart.data["worker"].startswith(f"{survivor.name}@")
    handed_after_s = (at_ms(handed) - term_ms) / 1000
    delay_s = (at_ms(restart) - at_ms(handed)) / 1000
    print(
        f"\ngrace {grace_s:g} s: handed over {handed_after_s:.2f} s after SIGTERM, "
        f"{victim.name} exited {exit_s:.2f} s after it, {survivor.name} started the turn "
        f"{delay_s:.3f} s after the handover (lease {LEASE_TTL_S:g} s)"
    )
    assert grace_s <= handed_after_s < grace_s + SLACK_S
    assert exit_s < grace_s + SLACK_S
    assert delay_s < SLACK_S < LEASE_TTL_S
    # and the other worker ran round 2 again from round 1's checkpoint, round 1 only once
    assert tool_runs() == {1: 1, 2: 2}
    record = record_of(result.id)
    assert record.state is TurnState.SUCCEEDED
    assert (record.deliveries, record.redeliveries, record.handovers) == (1, 0, 1)
    assert survivor.alive()


def test_an_idle_worker_exits_at_once(make_jobs: Any) -> None:
    jobs = make_jobs()  # the default grace: 30 s
    worker = jobs.worker()
    sent = terminate(worker)
    exit_s = exited_after_s(worker, sent, timeout_s=10)
    print(f"\nan idle worker exited {exit_s:.2f} s after SIGTERM")
    assert worker.popen.returncode == 0
    assert exit_s < 3.0


def holds_prefetched(worker_name: str, turn_id: str) -> bool:
    ctx = job_context()
    for name, raw in ctx.redis.hgetall(ctx.keys.workers).items():
        if name.decode().startswith(f"{worker_name}@"):
            return turn_id in [turn for turn, _ in orjson.loads(raw)["received"]]
    return False


def test_the_turns_a_stopping_worker_prefetched_go_to_another_worker_at_once(
    make_jobs: Any,
) -> None:
    # Given a worker with one slot, busy with a turn of two 3 s tool rounds, holding the next
    # turn's message prefetched (a prefetch multiplier of 2, see test_recovery.py), and a
    # second worker that cannot get that message meanwhile
    jobs = make_jobs(AGENTJOBS_SHUTDOWN_GRACE_S="10")
    w1 = jobs.worker(name="w1", concurrency=1, extra_args=["--prefetch-multiplier", "2"])
    busy = run_turn.delay(
        agent="demo", conversation_id="deploy-busy", message="where is my order? rounds:2 slow:3"
    )
    wait_until(lambda: started(busy.id, "call_1"), 30, "the busy turn's tool to start")
    prefetched = run_turn.delay(agent="demo", conversation_id="deploy-next", message="hi")
    wait_until(lambda: holds_prefetched("w1", prefetched.id), 15, "w1 to report it prefetched")
    w2 = jobs.worker(name="w2")
    assert record_of(prefetched.id).state is TurnState.QUEUED
    records = job_context().records

    # When w1 is told to stop
    term_ms = records.server_time_ms()
    sent = terminate(w1)

    # Then the prefetched turn runs on w2 at once, not once w1's busy turn reaches a check point
    assert prefetched.get(timeout=20)["content"] == "Done: hi"
    record = record_of(prefetched.id)
    assert record.worker.startswith("w2@")
    assert (record.deliveries, record.redeliveries, record.handovers) == (1, 0, 0)
    prefetched_after_s = (record.started_at_ms - term_ms) / 1000
    # and the busy turn is handed over at its next check point, w1 exits, w2 finishes the turn
    exit_s = exited_after_s(w1, sent, timeout_s=15)
    assert busy.get(timeout=30)["content"] == "Done: where is my order? rounds:2 slow:3"
    (handed,) = [e for e in events_of(busy.id) if e.type == "turn.handed_over"]
    print(
        f"\nthe prefetched turn started on w2 {prefetched_after_s:.2f} s after SIGTERM; the busy "
        f"one was handed over {(at_ms(handed) - term_ms) / 1000:.2f} s after it; w1 exited "
        f"{exit_s:.2f} s after it"
    )
    assert prefetched_after_s < SLACK_S
    assert record.started_at_ms < at_ms(handed)
    assert exit_s < (at_ms(handed) - term_ms) / 1000 + SLACK_S
    assert record_of(busy.id).worker.startswith("w2@")
    assert tool_runs() == {1: 1, 2: 1}
    assert w2.alive()
