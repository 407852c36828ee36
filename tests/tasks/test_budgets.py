"""Shared provider budgets and tenant token caps against real workers and a real Redis
(docs/platform.md, "Budgets and fairness"). The provider of tests/tasks/budget_agents.py keeps its
own log of the calls it answered and the tokens it reported; the windows are checked on that log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest

from tasks import run_turn, turn_status
from tasks.operate.events import iter_events
from tasks.operate.inspect import live_stats
from tasks.operate.metrics import tokens_family
from tasks.queue.context import job_context
from tasks.testing import wait_until
from tests.tasks.budget_agents import LOG_KEY
from tests.tasks.conftest import TEST_AGENTS, Jobs

pytestmark = pytest.mark.integration

AGENTS = {**TEST_AGENTS, "metered": "tests.tasks.budget_agents:build_metered_agent"}


def _env(**settings: str) -> dict[str, str]:
    agents = ",".join(f"{name}={target}" for name, target in AGENTS.items())
    return {"AGENTJOBS_AGENTS": agents, **settings}


def provider_log(jobs: Jobs) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in jobs.redis.lrange(LOG_KEY, 0, -1)]


def busiest_window(log: list[dict[str, Any]], window_ms: float, key: str | None) -> float:
    """The most any span of `window_ms` of the provider's log holds: calls, or `key` summed."""
    answered = sorted((e["at"], e[key] if key else 1) for e in log if e["status"] == 200)
    best = 0.0
    for i, (start, _) in enumerate(answered):
        inside = [n for at, n in answered[i:] if at < start + window_ms]
        best = max(best, sum(inside))
    return best


def submit(n: int, prefix: str, identity: dict[str, str] | None = None) -> list[Any]:
    return [
        run_turn.delay(
            agent="metered",
            conversation_id=f"{prefix}-{i}",
            message=f"question {i}",
            **({"identity": identity} if identity else {}),
        )
        for i in range(n)
    ]


def test_a_requests_budget_holds_across_two_workers_and_is_used(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_BUDGETS="fake:m1=requests:4/1s"))
    jobs.worker(concurrency=4)
    jobs.worker(concurrency=4)
    jobs.pump()
    started = time.monotonic()
    results = submit(16, "req")
    replies = [r.get(timeout=60) for r in results]
    took = time.monotonic() - started
    assert all(reply["content"].startswith("answered:") for reply in replies)
    log = provider_log(jobs)
    assert len(log) == 16
    assert busiest_window(log, 1000, None) <= 4
    # 16 calls at 4 a second need three full windows after the first: waiting turns must be
    # started as the window frees, not long after.
    assert took < 8, f"16 calls at 4/s took {took:.1f} s"
    waited = [e for r in results for e in iter_events(r.id, block_s=0.01)]
    budget_waits = [e for e in waited if e.type == "budget.waiting"]
    assert budget_waits, "no turn waited for the budget"
    assert {e.data["waitingFor"] for e in budget_waits} == {"budget"}
    assert all(
        e.data["budget"] == "fake:m1" and e.data["limit"] == "requests:4/1s" for e in budget_waits
    )
    # A wait is not an attempt.
    assert all(reply["attempts"] == 1 for reply in replies)


def test_a_tokens_budget_settles_with_reported_usage(make_jobs: Any) -> None:
    # Each call reserves its estimate plus the output cap of 50, and reports 30 in all: the
    # settle hands the difference back, so more calls fit a window than reservations alone.
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_BUDGETS="fake:*=tokens:200/1s"))
    jobs.worker(concurrency=4)
    jobs.worker(concurrency=4)
    jobs.pump()
    results = submit(20, "tok")
    for result in results:
        result.get(timeout=60)
    log = provider_log(jobs)
    assert len(log) == 20
    assert busiest_window(log, 1000, "tokens") <= 200


def test_a_turn_waiting_for_a_budget_shows_it_in_its_status(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(
        **_env(AGENTJOBS_BUDGETS="fake:m1=requests:1/3s", AGENTJOBS_TEST_CALL_S="0")
    )
    jobs.worker(concurrency=2)
    jobs.pump()
    turns = submit(2, "status")
    seen: list[Any] = []

    def one_waiting() -> bool:
        found = [s for s in map(turn_status, (t.id for t in turns)) if s is not None]
        seen[:] = [s for s in found if s.waiting_for == "budget"]
        return bool(seen)

    wait_until(one_waiting, 10, "one of the two turns waiting for the budget")
    (status,) = seen
    assert status.state == "waiting" and status.due_at is not None
    for result in turns:
        assert result.get(timeout=30)["attempts"] == 1
    done = turn_status(status.turn_id)
    assert done is not None and done.waiting_for is None


def test_a_call_larger_than_the_whole_limit_is_dead_lettered_at_once(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_BUDGETS="fake:m1=tokens:40/1s"))
    jobs.worker()
    jobs.pump()
    (result,) = submit(1, "small")
    with pytest.raises(Exception) as raised:
        result.get(timeout=30)
    assert "budget_too_small" in str(raised.value)
    status = turn_status(result.id)
    assert status is not None and status.state == "dead_lettered"
    assert provider_log(jobs) == []


def test_a_429_with_retry_after_closes_the_budget_for_every_worker(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_BUDGETS="fake:m1=requests:100/1s"))
    jobs.worker(concurrency=2)
    jobs.worker(concurrency=2)
    jobs.pump()
    limited = run_turn.delay(agent="metered", conversation_id="rl", message="rate-limit-once")
    wait_until(lambda: provider_log(jobs), 20, "the 429")
    others = submit(6, "after")
    for result in [limited, *others]:
        result.get(timeout=60)
    log = provider_log(jobs)
    refused_at = next(e["at"] for e in log if e["status"] == 429)
    answered = [e["at"] for e in log if e["status"] == 200]
    assert len(answered) == 7
    # Nothing was called while the budget was closed (retry-after 1 s; 20 ms of clock slack).
    assert all(at >= refused_at + 980 for at in answered), sorted(a - refused_at for a in answered)


def test_a_tenant_at_its_token_cap_waits_and_others_do_not(make_jobs: Any) -> None:
    # Each call reports 30 tokens: acme's cap admits two calls per 2 s window.
    jobs: Jobs = make_jobs(**_env(AGENTJOBS_TENANT_TOKEN_LIMIT="acme=60/2s"))
    jobs.worker(concurrency=4)
    jobs.pump()
    # The cap counts reported usage: calls that start together all start below it.
    acme = submit(2, "acme", {"tenant": "acme"})
    for result in acme:
        result.get(timeout=30)
    acme.append(
        run_turn.delay(
            agent="metered", conversation_id="acme-2", message="third", identity={"tenant": "acme"}
        )
    )
    wait_until(
        lambda: (s := turn_status(acme[2].id)) is not None and s.waiting_for == "tenant_tokens",
        10,
        "acme's third turn waiting for its cap",
    )
    beta = submit(2, "beta", {"tenant": "beta"})
    for result in beta:
        result.get(timeout=10)
    assert acme[2].get(timeout=30)["attempts"] == 1


def test_over_the_cap_dead_letters_with_the_setting(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(
        **_env(AGENTJOBS_TENANT_TOKEN_LIMIT="acme=30/1h", AGENTJOBS_TENANT_OVER_LIMIT="dead_letter")
    )
    jobs.worker()
    jobs.pump()
    (first,) = submit(1, "over", {"tenant": "acme"})
    first.get(timeout=30)
    (second,) = submit(1, "over-again", {"tenant": "acme"})
    with pytest.raises(Exception) as raised:
        second.get(timeout=30)
    assert "tenant_over_limit" in str(raised.value)


def test_usage_reports_tokens_per_tenant_agent_and_model(make_jobs: Any) -> None:
    jobs: Jobs = make_jobs(**_env())
    jobs.worker(concurrency=2)
    jobs.pump()
    for result in [*submit(3, "u-acme", {"tenant": "acme"}), *submit(2, "u-none")]:
        result.get(timeout=30)
    command = [sys.executable, "-m", "tasks.cli", "usage", "--json"]
    shown = subprocess.run(command, env=jobs.env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = {(r["tenant"], r["agent"], r["model"]): r for r in json.loads(shown.stdout)["rows"]}
    assert rows[("acme", "metered", "m1")]["inputTokens"] == 60
    assert rows[("acme", "metered", "m1")]["outputTokens"] == 30
    assert rows[("", "metered", "m1")]["inputTokens"] == 40
    only = subprocess.run(
        [*command, "--tenant", "acme"], env=jobs.env, capture_output=True, text=True, timeout=60
    )
    assert [r["tenant"] for r in json.loads(only.stdout)["rows"]] == ["acme"]
    # The same tokens in agentjobs_tokens_total, without and with the tenant label.
    figures = live_stats(job_context())
    plain = {
        tuple(s.labels.values()): s.value for s in tokens_family(figures["counters"], False).samples
    }
    assert plain[("input", "m1")] == 100 and plain[("output", "m1")] == 50
    labelled = tokens_family(figures["counters"], True).samples
    assert {(s.labels["tenant"], s.labels["direction"], s.value) for s in labelled} >= {
        ("acme", "input", 60),
        ("", "input", 40),
    }
