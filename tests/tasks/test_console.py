"""The console (`agentjobs web`, tasks/web/) in a real browser: Chromium driven by Playwright,
against a real worker, pump and Redis, the console served by uvicorn with a token. Buttons are
found by their accessible names, and every live change is seen on the open page, without a
reload (a marker set on the page's window before the click is still there after it)."""

from __future__ import annotations

import http.server
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tasks import run_turn, turn_status
from tasks.queue.context import job_context
from tasks.store.records import TurnState
from tasks.testing import wait_until
from tests.tasks.console_agents import broken_key
from tests.tasks.test_pauses import paused, runs
from tests.tasks.test_pauses import submit as submit_person
from tests.tasks.test_streaming import WIRE_FORMATS, chat_server, provider_env
from tests.tasks.test_streaming import submit as submit_streamed
from tests.tasks.test_web_events import serving

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.tasks.browser"]

TOKEN = "console-test-token-5b1d0e"
OPERATOR = "Dana Ops"
LIVE_S = 20_000  # ms Playwright waits for a live change


@pytest.fixture
def console(make_jobs: Any) -> Iterator[tuple[str, Any]]:
    """A worker, the pump and the console (with its token): the console's origin and the jobs."""
    jobs = make_jobs()
    jobs.worker()
    jobs.pump()
    with serving(token=TOKEN) as origin:
        yield origin, jobs


def sign_in(page: Page, origin: str, path: str = "/") -> None:
    page.goto(f"{origin}{path}")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_label("Your name").fill(OPERATOR)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{origin}{path}")


def mark_window(page: Page) -> None:
    page.evaluate("window.__notReloaded = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"


def expect_state(page: Page, state: str) -> None:
    expect(page.get_by_test_id("turn-state")).to_have_text(state, timeout=LIVE_S)


def submit_console(mode: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    result = run_turn.delay(agent="console", conversation_id=f"c-{tag}", message=f"{tag} {mode}")
    return result.id, tag


def state_of(turn_id: str) -> TurnState | None:
    status = turn_status(turn_id)
    return status.state if status is not None else None


def test_approve_from_the_page_and_see_it_succeed(console: Any, page: Page) -> None:
    origin, jobs = console
    result, tag = submit_person("refund")
    paused(result.id)
    sign_in(page, origin, f"/turns/{result.id}")
    expect_state(page, "paused")
    # The timeline replays what happened before the page opened: lookup ran, refund waits.
    expect(page.get_by_text("tool.started", exact=True)).to_have_count(1, timeout=LIVE_S)
    mark_window(page)
    page.get_by_role("button", name="Approve").click()
    expect_state(page, "succeeded")
    expect(page.get_by_text("turn.succeeded", exact=True)).to_be_visible(timeout=LIVE_S)
    expect(page.get_by_test_id("turn-answer")).to_contain_text("refunded A")
    assert_not_reloaded(page)
    assert runs(jobs, tag) == ["lookup A", "refund A"]
    decided = [e for e in job_context().redis.xrange(_events_key(result.id))]
    actors = [fields.get(b"data", b"") for _, fields in decided]
    assert any(OPERATOR.encode() in data for data in actors), "the operator is the actor"


def _events_key(turn_id: str) -> str:
    ctx = job_context()
    record = ctx.records.find(turn_id)
    assert record is not None
    return ctx.keys.for_namespace(record.namespace).events(turn_id)


def test_edited_arguments_are_checked_as_json_then_approved(console: Any, page: Page) -> None:
    origin, jobs = console
    result, tag = submit_person("credit:500")
    paused(result.id)
    sign_in(page, origin, f"/turns/{result.id}")
    mark_window(page)
    box = page.get_by_label(re.compile("Arguments of"))
    expect(box).to_have_value(re.compile(r'"amount": 500'))
    box.fill('{"amount": 50, "tag": ')  # not JSON: refused on the page, nothing sent
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("alert")).to_contain_text("not valid JSON")
    assert state_of(result.id) is TurnState.PAUSED
    box.fill(f'{{"amount": 50, "tag": "{tag}"}}')
    page.get_by_role("button", name="Approve").click()
    expect_state(page, "succeeded")
    assert_not_reloaded(page)
    assert runs(jobs, tag) == ["credit 50"]


def test_reject_with_a_message(console: Any, page: Page) -> None:
    origin, jobs = console
    result, tag = submit_person("refund")
    paused(result.id)
    sign_in(page, origin, f"/turns/{result.id}")
    mark_window(page)
    page.get_by_label(re.compile("Message for")).fill("not this one")
    page.get_by_role("button", name="Reject").click()
    expect_state(page, "succeeded")
    expect(page.get_by_test_id("turn-answer")).to_contain_text("not this one")
    assert_not_reloaded(page)
    assert runs(jobs, tag) == ["lookup A"]  # the refund never ran


def test_answer_a_question(console: Any, page: Page) -> None:
    origin, _ = console
    result, _ = submit_person("ask")
    paused(result.id)
    sign_in(page, origin, f"/turns/{result.id}")
    mark_window(page)
    expect(page.get_by_text("Which order?")).to_be_visible()
    page.get_by_label(re.compile("Answer to")).fill("order B-17")
    page.get_by_role("button", name="Answer").click()
    expect_state(page, "succeeded")
    expect(page.get_by_test_id("turn-answer")).to_contain_text("order B-17")
    assert_not_reloaded(page)


def test_cancel_a_running_turn(console: Any, page: Page) -> None:
    origin, _ = console
    turn_id, _ = submit_console("slow")
    wait_until(lambda: state_of(turn_id) is TurnState.RUNNING, 20, "the turn to run")
    sign_in(page, origin, f"/turns/{turn_id}")
    expect_state(page, "running")
    mark_window(page)
    page.get_by_role("button", name="Cancel turn").click()
    expect_state(page, "cancelled")
    expect(page.get_by_text("turn.cancelled", exact=True)).to_be_visible(timeout=LIVE_S)
    assert_not_reloaded(page)
    status = turn_status(turn_id)
    assert status is not None and OPERATOR in (status.cancel_reason or "")


def test_replay_all_dead_letters_of_a_reason_after_confirm(console: Any, page: Page) -> None:
    origin, jobs = console
    tags = [uuid.uuid4().hex[:8] for _ in range(3)]
    for tag in tags:
        jobs.redis.set(broken_key(tag), 1)
    flaky = [
        run_turn.delay(agent="console", conversation_id=f"c-{t}", message=f"{t} flaky").id
        for t in tags
    ]
    other = run_turn.delay(agent="broken", conversation_id="c-other", message="x").id
    for turn_id in [*flaky, other]:
        wait_until(lambda t=turn_id: state_of(t) is TurnState.DEAD_LETTERED, 20, "dead letters")
    store = job_context().dead_letters
    reasons = {e["taskId"]: e["reason"] for e in store.list_entries()}
    assert {reasons[t] for t in flaky} == {"non_resumable"} and reasons[other] != "non_resumable"
    for tag in tags:
        jobs.redis.delete(broken_key(tag))

    sign_in(page, origin, "/dead-letters?reason=non_resumable")
    mark_window(page)
    page.get_by_role("button", name="Replay all").click()
    expect(page.get_by_test_id("bulk-count")).to_have_text("3")
    assert len(store.list_entries()) == 4, "nothing is replayed before Confirm"
    page.get_by_role("button", name="Confirm").click()
    expect(page.get_by_role("status")).to_contain_text("Replayed 3")
    assert_not_reloaded(page)
    left = store.list_entries()
    assert [e["taskId"] for e in left] == [other]
    replays = [store.replayed_as(f"dl-{t}") for t in flaky]
    for new_id in replays:
        wait_until(lambda n=new_id: state_of(n) is TurnState.SUCCEEDED, 20, "the replays")


def test_sign_in_is_refused_without_the_token(console: Any, page: Page) -> None:
    origin, _ = console
    page.goto(f"{origin}/turns")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fturns"))
    page.get_by_label("Token").fill("not-the-token")
    page.get_by_label("Your name").fill(OPERATOR)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not the console's token")
    page.goto(f"{origin}/turns")
    expect(page).to_have_url(re.compile(r"/login"))  # still not signed in
    json_headers = {"Accept": "application/json"}
    assert httpx.get(f"{origin}/turns", headers=json_headers).status_code == 401
    bearer = {**json_headers, "Authorization": f"Bearer {TOKEN}"}
    listed = httpx.get(f"{origin}/turns", headers=bearer)
    assert listed.status_code == 200 and listed.json()["turns"] == []


class _Evil(http.server.BaseHTTPRequestHandler):
    """Another site: its page posts a form to the console's cancel, as a CSRF attack would."""

    target = ""

    def do_GET(self) -> None:
        body = (
            f'<form id="f" method="post" action="{self.target}">'
            '<input name="reason" value="pwned"></form>'
            '<script>document.getElementById("f").submit()</script>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_cross_site_post_is_refused(console: Any, page: Page) -> None:
    origin, _ = console
    result, _ = submit_person("refund")
    paused(result.id)
    sign_in(page, origin, f"/turns/{result.id}")  # the browser holds a session cookie
    _Evil.target = f"{origin}/turns/{result.id}/cancel"
    evil = http.server.HTTPServer(("127.0.0.1", 0), _Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        with page.expect_response(_Evil.target) as posted:
            page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        assert posted.value.status == 403
        expect(page.get_by_text("another site")).to_be_visible()
    finally:
        evil.shutdown()
    assert state_of(result.id) is TurnState.PAUSED
    # The same post from the console's own page goes through.
    page.goto(f"{origin}/turns/{result.id}")
    page.get_by_role("button", name="Cancel turn").click()
    expect_state(page, "cancelled")


def test_pages_list_and_answer_json(console: Any, page: Page) -> None:
    origin, _ = console
    result, _ = submit_person("refund")
    paused(result.id)
    done, _ = submit_console("hello")
    wait_until(lambda: state_of(done) is TurnState.SUCCEEDED, 20, "the echo turn")
    sign_in(page, origin, "/turns")
    rows = page.locator("table.list tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text(done)  # newest first
    page.get_by_label("State").select_option("paused")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(result.id)
    page.goto(f"{origin}/approvals")
    expect(page.get_by_role("button", name="Approve")).to_have_count(1)
    page.goto(f"{origin}/")
    expect(page.locator('[data-state="paused"]')).to_have_text("1")

    bearer = {"Accept": "application/json", "Authorization": f"Bearer {TOKEN}"}
    one = httpx.get(f"{origin}/turns/{result.id}", headers=bearer).json()
    assert one["turn_id"] == result.id and one["state"] == "paused"
    assert one["pending"][0]["tool"] == "refund"
    assert re.match(r"\d{4}-\d\d-\d\dT", one["created_at"])
    listed = httpx.get(f"{origin}/turns?state=succeeded", headers=bearer).json()
    assert [t["turn_id"] for t in listed["turns"]] == [done]
    approved = httpx.post(
        f"{origin}/turns/{result.id}/actions/{one['pending'][0]['request_id']}/approve",
        headers=bearer,
    )
    assert approved.status_code == 200 and approved.json()["ok"] is True
    wait_until(lambda: state_of(result.id) is TurnState.SUCCEEDED, 20, "the approved turn")


@pytest.fixture
def streaming_console(make_jobs: Any) -> Iterator[str]:
    """A worker whose agent streams its answer from a model server, and the console."""
    with chat_server(WIRE_FORMATS["openai"]) as chat:
        jobs = make_jobs(**provider_env(chat.origin))
        jobs.worker()
        with serving(token=TOKEN) as origin:
            yield origin


def test_the_timeline_shows_the_answer_as_it_streams(streaming_console: str, page: Page) -> None:
    origin = streaming_console
    result = submit_streamed("hello pieces:80 pause:0.05", f"c-{uuid.uuid4().hex[:8]}")
    sign_in(page, origin, f"/turns/{result.id}")
    streamed = page.get_by_label("Streamed text")
    expect(streamed).to_contain_text("word1 ", timeout=LIVE_S)
    # Seen while the turn still runs: the text arrives before the answer is stored.
    assert state_of(result.id) is TurnState.RUNNING
    expect_state(page, "succeeded")
    reply = result.get(timeout=30)["content"]
    expect(streamed).to_have_text(reply)
    expect(page.get_by_text("token.delta", exact=True)).to_have_count(0)  # text, not rows


def test_approvals_conversations_and_one_dead_letter(console: Any, page: Page) -> None:
    origin, jobs = console
    first, first_tag = submit_person("refund")
    second, _ = submit_person("ask")
    paused(first.id)
    paused(second.id)
    doomed = run_turn.delay(agent="broken", conversation_id="c-doomed", message="x").id
    wait_until(lambda: state_of(doomed) is TurnState.DEAD_LETTERED, 20, "the dead letter")

    sign_in(page, origin, "/approvals")
    mark_window(page)
    expect(page.get_by_role("button", name="Approve")).to_have_count(1)
    expect(page.get_by_role("button", name="Answer")).to_have_count(1)
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("status")).to_contain_text("Approved")
    assert_not_reloaded(page)
    wait_until(lambda: state_of(first.id) is TurnState.SUCCEEDED, 20, "the approved turn")
    assert runs(jobs, first_tag) == ["lookup A", "refund A"]

    page.goto(f"{origin}/conversations/_/_/c-{first_tag}")
    transcript = page.locator("ol.transcript > li")
    expect(transcript.first).to_contain_text(f"{first_tag} refund")
    expect(page.locator("ol.transcript")).to_contain_text("refunded A")

    page.goto(f"{origin}/dead-letters")
    mark_window(page)
    page.get_by_role("button", name=f"Purge dl-{doomed}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Purged dl-{doomed}")
    expect(page.get_by_text("No dead letters match.")).to_be_visible()
    assert_not_reloaded(page)
    assert job_context().dead_letters.list_entries() == []
