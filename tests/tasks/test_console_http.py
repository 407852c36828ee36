"""The console's rules over plain HTTP (httpx against uvicorn, a real Redis): sign-in and the
token, the cross-site checks on every POST, with and without a token, and the typed refusals
of bad query values and forms. The browser tests (test_console.py) drive the pages."""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tasks import run_turn, turn_status
from tasks.budgets.usage import BUCKET_MS, SEP
from tasks.core.limits import LimitKind
from tasks.queue.context import job_context
from tasks.store.records import TurnState
from tests.tasks.test_web_events import serving

pytestmark = pytest.mark.integration

TOKEN = "console-http-token-91c2"
JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}


def queued_turn() -> str:
    """A turn that stays queued (no worker runs here)."""
    tag = uuid.uuid4().hex[:8]
    return str(run_turn.delay(agent="console", conversation_id=f"c-{tag}", message="x").id)


def state_of(turn_id: str) -> TurnState | None:
    status = turn_status(turn_id)
    return status.state if status is not None else None


@pytest.fixture
def open_console(make_jobs: Any) -> Iterator[str]:
    make_jobs()
    with serving() as origin:
        yield origin


@pytest.fixture
def guarded(make_jobs: Any) -> Iterator[str]:
    make_jobs()
    with serving(token=TOKEN) as origin:
        yield origin


def csrf_of(client: httpx.Client, path: str = "/") -> str:
    page = client.get(path, headers=HTML)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text) or re.search(
        r'"X-CSRF-Token": "([^"]+)"', page.text
    )
    assert found, "every page carries the session's CSRF token"
    return found.group(1)


def test_without_a_token_a_script_acts_but_a_browser_needs_the_csrf_token(
    open_console: str,
) -> None:
    origin = open_console
    one, two, three = queued_turn(), queued_turn(), queued_turn()
    # A script on this machine: no cookie, no Origin, no fetch metadata.
    done = httpx.post(f"{origin}/turns/{one}/cancel", headers=JSON)
    assert done.status_code == 200 and done.json()["ok"] is True
    assert state_of(one) is TurnState.CANCELLED
    # A page on another site posting to the console: refused, though no token guards it.
    forged = httpx.post(
        f"{origin}/turns/{two}/cancel", headers={"Origin": "http://evil.example"}, data={}
    )
    assert forged.status_code == 403 and "another site" in forged.text
    # A browser that has a session but no token in its form (same origin): refused too.
    with httpx.Client(base_url=origin) as browser:
        csrf_of(browser)
        plain = browser.post(f"/turns/{two}/cancel", headers={"Origin": origin}, data={})
        assert plain.status_code == 403 and "CSRF" in plain.text
        assert state_of(two) is TurnState.QUEUED
        token = csrf_of(browser, f"/turns/{three}")
        sent = browser.post(
            f"/turns/{three}/cancel",
            headers={"Origin": origin, **JSON},
            data={"csrf_token": token, "reason": "duplicate"},
        )
        assert sent.status_code == 200, sent.text
    status = turn_status(three)
    assert status is not None and status.cancel_reason == (
        "cancelled by console from the console: duplicate"
    )


def test_with_a_token_every_request_needs_a_session_or_the_bearer(guarded: str) -> None:
    origin = guarded
    turn_id = queued_turn()
    with httpx.Client(base_url=origin) as client:
        sent_away = client.get("/turns?state=queued", headers=HTML)
        assert sent_away.status_code == 303
        assert sent_away.headers["location"] == "/login?next=%2Fturns%3Fstate%3Dqueued"
        for path in ("/turns", f"/turns/{turn_id}", f"/turns/{turn_id}/events", "/"):
            assert client.get(path, headers=JSON).status_code == 401, path
        assert client.get("/login", headers=HTML).status_code == 200
        assert client.get("/static/htmx.min.js").status_code == 200
        refused = client.post(f"/turns/{turn_id}/cancel", data={})
        assert refused.status_code == 401 and state_of(turn_id) is TurnState.QUEUED
    bearer = {"Authorization": f"Bearer {TOKEN}", "X-Agentjobs-Operator": "ci-bot", **JSON}
    listed = httpx.get(f"{origin}/turns", headers=bearer).json()
    assert [t["turn_id"] for t in listed["turns"]] == [turn_id]
    wrong = {**bearer, "Authorization": "Bearer nope"}
    assert httpx.get(f"{origin}/turns", headers=wrong).status_code == 401
    cancelled = httpx.post(f"{origin}/turns/{turn_id}/cancel", headers=bearer)
    assert cancelled.status_code == 200
    status = turn_status(turn_id)
    assert status is not None and "by ci-bot" in (status.cancel_reason or "")


def test_sign_in_checks_the_token_the_name_the_origin_and_where_it_goes(guarded: str) -> None:
    origin = guarded
    form = {"token": TOKEN, "operator": "Ana", "next": "/turns"}
    with httpx.Client(base_url=origin) as client:
        wrong = client.post("/login", data={**form, "token": "guess"})
        assert wrong.status_code == 401 and "not the console's token" in html.unescape(wrong.text)
        nameless = client.post("/login", data={**form, "operator": "  "})
        assert nameless.status_code == 400 and "give your name" in nameless.text
        forged = client.post("/login", data=form, headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403
        assert client.get("/turns", headers=JSON).status_code == 401  # none of them signed in
        away = client.post("/login", data={**form, "next": "//evil.example/x"})
        assert away.status_code == 303 and away.headers["location"] == "/"
        assert client.get("/turns", headers=JSON).status_code == 200
        assert "signed in as <strong>Ana</strong>" in client.get("/", headers=HTML).text
        token = csrf_of(client)
        client.post("/logout", data={"csrf_token": token})
        assert client.get("/turns", headers=JSON).status_code == 401


def test_bad_values_are_refused_by_name(open_console: str) -> None:
    origin = open_console
    turn_id = queued_turn()

    def get(path: str) -> httpx.Response:
        return httpx.get(f"{origin}{path}", headers=JSON)

    def post(path: str, **data: str) -> httpx.Response:
        return httpx.post(f"{origin}{path}", headers=JSON, data=data)

    bad_state = get("/turns?state=bogus")
    assert bad_state.status_code == 400 and "state 'bogus' is not one of" in bad_state.text
    assert get("/turns?after=nope").status_code == 400
    assert "cursor" in get("/turns?after=nope").json()["error"]
    assert get("/turns/no-such-turn").status_code == 404
    assert get("/conversations/_/_/c-1?start=abc").status_code == 400
    assert get("/dead-letters/bulk?action=explode").status_code == 400
    assert get("/dead-letters/bulk?action=purge").json() == {"action": "purge", "count": 0}
    unconfirmed = post("/dead-letters/bulk", action="purge")
    assert unconfirmed.status_code == 400 and "Confirm" in unconfirmed.json()["message"]
    not_json = post(f"/turns/{turn_id}/actions/req-1/approve", args="{oops")
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["message"]
    not_object = post(f"/turns/{turn_id}/actions/req-1/approve", args="[1, 2]")
    assert not_object.status_code == 400 and "JSON object" in not_object.json()["message"]
    not_paused = post(f"/turns/{turn_id}/actions/req-1/approve")
    assert not_paused.status_code == 409
    unknown = post("/turns/no-such-turn/actions/req-1/reject", message="no")
    assert unknown.status_code == 409 and "no such turn" in unknown.json()["message"]
    assert post("/dead-letters/dl-nothing/purge").status_code == 404
    assert post("/dead-letters/dl-nothing/replay").status_code == 409
    assert state_of(turn_id) is TurnState.QUEUED  # nothing above touched it


def test_the_overview_shows_budgets_in_use_and_tokens_by_tenant(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BUDGETS="fake:m1=requests:5/60s,tokens:1000/60s")
    ctx = job_context()
    budget = ctx.settings.budgets.budgets[0]
    needs = {LimitKind.REQUESTS: 1, LimitKind.TOKENS: 300}
    assert ctx.ledger.reserve(budget, "t-1:tok:1", "t-1", needs).admission == "reserved"
    assert ctx.ledger.settle(budget, "t-1:tok:1", {LimitKind.TOKENS: 120})
    assert ctx.ledger.reserve(budget, "t-2:tok:1", "t-2", needs).admission == "reserved"
    bucket = ctx.records.server_time_ms() // BUCKET_MS
    usage_key = ctx.keys.shard(3).usage(bucket)
    jobs.redis.hset(usage_key, SEP.join(["acme", "demo", "m1", "in"]), 700)
    jobs.redis.hset(usage_key, SEP.join(["acme", "demo", "m1", "out"]), 42)
    with serving() as origin:
        figures = httpx.get(origin, headers=JSON).json()
        page = html.unescape(httpx.get(origin, headers=HTML).text)
    limits = {limit["label"]: limit for limit in figures["budgets"][0]["limits"]}
    assert limits["requests:5/1m"]["used"] == 2  # one settled in the window, one held
    assert limits["tokens:1000/1m"]["used"] == 120 + 300
    assert figures["usageLastDay"] == [{"tenant": "acme", "inputTokens": 700, "outputTokens": 42}]
    assert "fake:m1" in page and "420 / 1000" in page and "acme" in page


def test_pages_answer_503_while_the_state_store_is_away(
    make_jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.queue.context import reset
    from tasks.testing import free_port

    make_jobs()
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    reset()
    with serving() as origin:
        for path in ("/", "/turns", "/dead-letters", "/approvals"):
            away = httpx.get(f"{origin}{path}", headers=JSON)
            assert away.status_code == 503, path
            assert "state store is unreachable" in away.json()["error"]
        assert httpx.get(f"{origin}/login", headers=HTML).status_code == 200  # still serving
