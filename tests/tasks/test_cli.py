"""The agentjobs command against a real job system: dead letters listed, shown, replayed (once,
or in bulk) and purged; turns listed and shown; a conversation shown; the figures of `stats`,
the pump's heartbeat among them; README's "Operating it" run as written; task events, once
enabled, reaching an event consumer as Flower's do."""

from __future__ import annotations

import re
import shlex
import threading
import time
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tasks import TurnDeadLettered, app, iter_events, load_conversation, run_turn
from tasks.cli import main, parse_duration_s
from tasks.queue.context import job_context
from tasks.store.dead_letters import iso_ms
from tasks.store.records import TurnState
from tasks.testing import wait_until
from tests.conftest import ROOT


def cli(*args: str, exit_code: int = 0, env: dict[str, str] | None = None) -> str:
    """The command's stdout (its stderr when it is to fail); a traceback fails the test."""
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    if exit_code:
        lines = result.stderr.strip().splitlines()
        assert result.stdout == "" and 1 <= len(lines) <= 2, result.output
        assert lines[0].startswith("agentjobs: ")
        return result.stderr
    return result.stdout


def dead_lettered(**payload: Any) -> TurnDeadLettered:
    with pytest.raises(TurnDeadLettered) as caught:
        run_turn.delay(**payload).get(timeout=30)
    return caught.value


def test_list_and_show_print_entries_as_json_and_tables(jobs: Any) -> None:
    auth = dead_lettered(agent="demo", conversation_id="c-auth", message="x fail:401")
    unknown = dead_lettered(agent="nobody", conversation_id="c-x", message="y")
    entries = orjson.loads(cli("dlq", "list", "--json"))
    assert [e["id"] for e in entries] == [auth.entry_id, unknown.entry_id]
    required = {
        "id",
        "reason",
        "errorType",
        "error",
        "attempts",
        "agent",
        "conversationId",
        "taskId",
        "firstFailedAt",
        "lastFailedAt",
        "checkpoint",
    }
    assert all(required <= set(e) for e in entries)
    only = orjson.loads(cli("dlq", "list", "--json", "--reason", "unknown_agent"))
    assert [e["id"] for e in only] == [unknown.entry_id]
    shown = orjson.loads(cli("dlq", "show", auth.entry_id, "--json"))
    assert shown["reason"] == "non_resumable" and shown["errorType"] == "ProviderHTTPError"
    assert shown["checkpoint"]["history"] == [{"role": "user", "content": "x fail:401"}]
    table = cli("dlq", "list")
    assert auth.entry_id in table and "non_resumable" in table and "unknown_agent" in table
    assert "c-auth" in cli("dlq", "show", auth.entry_id)
    # --json keeps each time both in ms and as ISO text; the table prints the ISO ones only
    assert shown["lastFailedAt"] == iso_ms(shown["lastFailedAtMs"])
    assert shown["firstFailedAt"] == iso_ms(shown["firstFailedAtMs"])
    table = cli("dlq", "show", auth.entry_id, env={"COLUMNS": "200"})
    assert field_value(table, "lastFailedAt") == shown["lastFailedAt"], table
    assert field_value(table, "firstFailedAt") == shown["firstFailedAt"], table
    assert "AtMs" not in table and str(shown["lastFailedAtMs"]) not in table, table
    assert field_value(table, "checkpoint").startswith("1 message, runId "), table
    assert "no dead-letter entry 'dl-nope'" in cli("dlq", "show", "dl-nope", exit_code=1)


def test_replay_resumes_with_a_fresh_budget_and_a_second_replay_runs_nothing(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="2")
    jobs.worker()
    jobs.pump()
    # Calls 1 and 2 fail (both attempts spent); after the replay, call 3 fails, call 4 answers.
    failed = dead_lettered(agent="demo", conversation_id="c-r", message="retry me fail:503x3")
    assert failed.reason == "max_attempts"
    output = cli("dlq", "replay", failed.entry_id)
    assert "resuming its checkpoint" in output
    turn_id = output.split(" as turn ")[1].split(" ")[0]
    again = cli("dlq", "replay", failed.entry_id)
    assert f"already replayed as turn {turn_id}" in again
    assert job_context().dead_letters.get(failed.entry_id) is None

    reply = app.AsyncResult(turn_id).get(timeout=30)
    assert reply["attempts"] == 2 and reply["content"] == "Done: retry me fail:503x3"
    stored = load_conversation("c-r")
    assert stored is not None
    assert [m["content"] for m in stored.history if m["role"] == "user"] == ["retry me fail:503x3"]
    calls = jobs.redis.keys(f"{job_context().keys.prefix}:demo:calls:*")
    assert int(jobs.redis.get(calls[0])) == 4, "the turn ran more than once after two replays"


def test_replay_after_the_conversation_moved_on_runs_the_message_again(jobs: Any) -> None:
    failed = dead_lettered(agent="demo", conversation_id="c-m", message="first fail:401")
    run_turn.delay(agent="demo", conversation_id="c-m", message="second").get(timeout=30)
    output = cli("dlq", "replay", failed.entry_id)
    assert "from its message" in output
    turn_id = output.split(" as turn ")[1].split(" ")[0]
    with pytest.raises(TurnDeadLettered):  # still a 401: it fails again, on the new history
        app.AsyncResult(turn_id).get(timeout=30)
    record = job_context().records.get(turn_id)
    assert record is not None and record.replay_of == failed.entry_id
    stored = load_conversation("c-m")
    assert stored is not None
    assert [m["content"] for m in stored.history] == ["second", "Done: second"]


def test_purge_by_reason_and_age(jobs: Any) -> None:
    dead_lettered(agent="nobody", conversation_id="a", message="x")
    dead_lettered(agent="demo", conversation_id="b", message="x fail:401")
    assert "purged 0 entries" in cli("dlq", "purge", "--older-than", "1h", "--yes")
    assert "purged 1 entry." in cli("dlq", "purge", "--reason", "unknown_agent", "--yes")
    assert [e["reason"] for e in orjson.loads(cli("dlq", "list", "--json"))] == ["non_resumable"]
    time.sleep(1.1)
    assert "purged 1 entry." in cli("dlq", "purge", "--older-than", "1s", "--yes")
    assert orjson.loads(cli("dlq", "list", "--json")) == []


def test_parse_duration() -> None:
    assert parse_duration_s("90") == 90
    assert parse_duration_s("15m") == 900
    assert parse_duration_s("2h") == 7200
    assert parse_duration_s("7d") == 604800
    with pytest.raises(Exception, match="not a duration"):
        parse_duration_s("soon")


def test_turn_show_follows_a_turn_through_its_states(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="3")
    jobs.worker()
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="s", message="z fail:503x1 rounds:2")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(result.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    waiting = cli("turn", "show", result.id)
    assert "waiting for retry (attempt 2) until" in waiting
    as_json = orjson.loads(cli("turn", "show", result.id, "--json"))
    assert as_json["state"] == "waiting" and as_json["attempt"] == 2
    assert "token" not in as_json
    result.get(timeout=30)
    assert "succeeded" in cli("turn", "show", result.id)


ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00"


def field_value(text: str, field: str) -> str:
    """The value `turn show` prints for `field` (the table's first column), or ""."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("│┃|").split("│")]
        if len(cells) == 2 and cells[0] == field:
            return cells[1]
    return ""


def test_turn_show_names_the_turn_its_times_and_its_message(make_jobs: Any) -> None:
    # Given a turn waiting for a retry (no pump runs to wake it), submitted with a deadline
    jobs = make_jobs()
    jobs.worker()
    waiting = run_turn.delay(
        agent="demo", conversation_id="times", message="what is due fail:503x1", deadline_s=600
    )
    records = job_context().records
    wait_until(
        lambda: (r := records.get(waiting.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    record = records.get(waiting.id)
    assert record is not None
    # When it is shown as JSON, every key of the record is there with its value, and beside
    # each time in ms the same time as ISO UTC text, and the message
    as_json = orjson.loads(cli("turn", "show", waiting.id, "--json"))
    for key, value in record.as_dict().items():
        if key != "checkpoint":
            assert as_json[key] == value, key
    assert as_json["message"] == "what is due fail:503x1"
    for key in ("createdAt", "updatedAt", "startedAt", "dueAt", "firstFailedAt", "deadlineAt"):
        assert as_json[key] == iso_ms(as_json[f"{key}Ms"]), key
    assert as_json["finishedAt"] is None and as_json["pausedAt"] is None
    assert as_json["pauseExpiresAt"] is None and as_json["pauseExpiresAtMs"] is None
    # and as a table it names the turn and gives its times as ISO UTC, the next retry's too
    text = cli("turn", "show", waiting.id, env={"COLUMNS": "200"})
    assert field_value(text, "turn") == waiting.id
    assert field_value(text, "message") == "what is due fail:503x1"
    for field, key in (("created", "createdAt"), ("next retry due", "dueAt")):
        assert field_value(text, field) == as_json[key], text
    assert re.fullmatch(ISO_UTC, field_value(text, "deadline")), text
    assert "Ms" not in text and field_value(text, "finished") == ""
    # Once it has succeeded, its finishing time is shown and no retry is due any more
    jobs.pump()
    waiting.get(timeout=30)
    done = cli("turn", "show", waiting.id, env={"COLUMNS": "200"})
    assert re.fullmatch(ISO_UTC, field_value(done, "finished")), done
    assert field_value(done, "next retry due") == ""
    assert orjson.loads(cli("turn", "show", waiting.id, "--json"))["finishedAt"] == field_value(
        done, "finished"
    )


def test_turn_show_of_a_paused_turn_gives_its_pause_and_what_is_left_of_its_deadline(
    jobs: Any,
) -> None:
    paused = run_turn.delay(
        agent="demo", conversation_id="pz", message="refund please refund:D-4", deadline_s=600
    )
    records = job_context().records
    wait_until(
        lambda: (r := records.get(paused.id)) is not None and r.state == "paused", 20, "paused"
    )
    as_json = orjson.loads(cli("turn", "show", paused.id, "--json"))
    assert as_json["pausedAt"] == iso_ms(as_json["pausedAtMs"])
    assert as_json["pauseExpiresAt"] == iso_ms(as_json["pauseExpiresAtMs"])
    assert as_json["pauseExpiresAtMs"] > as_json["pausedAtMs"]
    assert 0 < as_json["deadlineLeftMs"] <= 600_000
    text = cli("turn", "show", paused.id, env={"COLUMNS": "200"})
    assert field_value(text, "pause expires") == as_json["pauseExpiresAt"], text
    assert field_value(text, "paused at") == as_json["pausedAt"], text
    assert re.fullmatch(
        r"\d+(\.\d)? m left, its clock stopped while paused", field_value(text, "deadline")
    )
    assert field_value(text, "message") == "refund please refund:D-4"


def test_refused_decisions_name_the_commands_and_options_to_use(jobs: Any) -> None:
    # Given a turn paused for an approval
    paused = run_turn.delay(agent="demo", conversation_id="dz", message="refund:D-9")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(paused.id)) is not None and r.state == "paused", 20, "paused"
    )
    [action] = orjson.loads(cli("turn", "show", paused.id, "--json"))["pending"]
    request = action["requestId"]
    pending = cli("turn", "pending")
    assert (
        "1 paused turn, 1 decision to make: `agentjobs turn approve|reject TURN_ID REQUEST_ID`, "
        "or `agentjobs turn answer TURN_ID REQUEST_ID TEXT` for a question."
    ) in pending, pending
    # When it is answered, or approved with arguments nested too deep to store, the refusal
    # names the commands and options of the command line, never the Python calls
    wrong = cli("turn", "answer", paused.id, request, "yes", exit_code=1)
    assert (
        f"turn {paused.id}, request {request}: an approval is decided with `agentjobs turn "
        "approve` or `agentjobs turn reject`, not `agentjobs turn answer`; `agentjobs turn "
        "pending` lists what waits for a decision"
    ) in wrong, wrong
    deep = '{"orderId": ' + "[" * 70 + "]" * 70 + "}"
    too_deep = cli("turn", "approve", paused.id, request, "--args", deep, exit_code=1)
    assert "--args is nested deeper than 64 levels; send JSON values only" in too_deep
    assert "and approve again" in too_deep
    for text in (wrong, too_deep):
        assert not re.search(r"approve_action|reject_action|answer_question|edited_args", text)
        assert "a approval" not in text
    # and the turn still waits; approving it twice is recorded once
    assert cli("turn", "approve", paused.id, request) == (
        f"approved request {request} of turn {paused.id}.\n"
    )
    assert cli("turn", "approve", paused.id, request) == (
        f"request {request} of turn {paused.id} was already decided that way; no change.\n"
    )
    assert paused.get(timeout=30)["content"].startswith("Done")


def test_task_events_reach_an_event_consumer_once_enabled_like_flower(jobs: Any) -> None:
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    receivers: list[Any] = []

    def consume() -> None:
        with app.connection() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": seen.append})
            receivers.append(receiver)
            ready.set()
            receiver.capture(limit=None, timeout=10, wakeup=True)

    def succeeded(task_id: str) -> bool:
        return any(e.get("type") == "task-succeeded" and e.get("uuid") == task_id for e in seen)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.5)
    # Task events are off by default (they cost throughput) ...
    quiet = run_turn.delay(agent="demo", conversation_id="ev", message="quiet")
    quiet.get(timeout=30)
    # ... and on once a monitor asks, as Flower does when it connects (or
    # `celery -A tasks control enable_events`)
    replies = app.control.enable_events(reply=True, timeout=2)
    assert [reply for r in replies for reply in r.values()] == [{"ok": "task events enabled"}]
    result = run_turn.delay(agent="demo", conversation_id="ev", message="events")
    result.get(timeout=30)
    wait_until(lambda: succeeded(result.id), 10, "a task-succeeded event")
    assert not succeeded(quiet.id)
    receivers[0].should_stop = True
    thread.join(timeout=15)


def test_purge_refuses_to_guess_which_entries_and_all_deletes_every_one(jobs: Any) -> None:
    dead_lettered(agent="nobody", conversation_id="p1", message="x")
    dead_lettered(agent="nobody", conversation_id="p2", message="x")
    # Given no filter, nothing is deleted and the operator is told which options there are
    refused = cli("dlq", "purge", "--yes", exit_code=2)
    assert "--reason R, --older-than 7d (or both), or --all" in refused
    assert len(orjson.loads(cli("dlq", "list", "--json"))) == 2
    assert "purged 2 entries." in cli("dlq", "purge", "--all", "--yes")
    assert "The dead-letter store is empty." in cli("dlq", "list")


def test_dlq_list_keeps_whole_ids_at_80_columns_and_counts_entries(jobs: Any) -> None:
    first = dead_lettered(
        agent="demo", conversation_id="a-conversation-id-long-enough", message="x fail:401"
    )
    # A replayed turn's entry has the longest id there is: dl-replay-<uuid>
    replayed = cli("dlq", "replay", first.entry_id).split(" as turn ")[1].split(" ")[0]
    with pytest.raises(TurnDeadLettered) as again:
        app.AsyncResult(replayed).get(timeout=30)
    dead_lettered(agent="nobody", conversation_id="b", message="y")
    table = cli("dlq", "list", env={"COLUMNS": "80"})
    lines = table.splitlines()
    assert all(len(line) <= 80 for line in lines), table
    ids = [e["id"] for e in orjson.loads(cli("dlq", "list", "--json"))]
    assert again.value.entry_id in ids and len(again.value.entry_id) == len("dl-replay-") + 36
    for entry_id in ids:
        assert any(line.split()[0] == entry_id for line in lines[1:]), table
    assert "non_resumable" in table and "2 entries." in table
    assert "1 entry." in cli("dlq", "list", "--reason", "unknown_agent", env={"COLUMNS": "80"})
    wide = cli("dlq", "list", env={"COLUMNS": "200"})
    assert "a-conversation-id-long-enough" in wide and "ProviderHTTPError" in wide


def test_bulk_replay_of_one_reason_runs_each_entry_again_and_turn_show_points_to_it(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="1")
    jobs.worker()
    jobs.pump()
    # Given two turns out of attempts (their second model call answers) and one of another reason
    spent = [
        dead_lettered(agent="demo", conversation_id=f"bulk-{n}", message=f"m{n} fail:503x1")
        for n in range(2)
    ]
    assert {e.reason for e in spent} == {"max_attempts"}
    other = dead_lettered(agent="nobody", conversation_id="bulk-x", message="z")
    # When every max_attempts entry is replayed
    output = cli("dlq", "replay", "--reason", "max_attempts", "--all")
    # Then each is run again as a new turn, printed with its id, and the other entry stays
    new_ids = dict(re.findall(r"replayed (\S+) as turn (\S+) \(", output))
    assert set(new_ids) == {e.entry_id for e in spent}
    assert "2 entries replayed." in output and "`agentjobs turn show NEW_ID`" in output
    for entry in spent:
        reply = app.AsyncResult(new_ids[entry.entry_id]).get(timeout=30)
        assert reply["content"].startswith("Done: m")
    assert [e["id"] for e in orjson.loads(cli("dlq", "list", "--json"))] == [other.entry_id]
    assert "nothing replayed" in cli("dlq", "replay", "--reason", "max_attempts", "--all")
    # and the replayed turn's record points to its replay, in text and in camelCase JSON
    old_turn = spent[0].entry_id.removeprefix("dl-")
    new_turn = new_ids[spent[0].entry_id]
    shown = cli("turn", "show", old_turn)
    assert f"replayed as turn {new_turn}" in shown
    assert f"follow the replay with `agentjobs turn show {new_turn}`" in shown
    as_json = orjson.loads(cli("turn", "show", old_turn, "--json"))
    assert as_json["replayedAs"] == new_turn and as_json["state"] == "dead_lettered"
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z0-9]*)*", key) for key in as_json), list(as_json)
    replay_json = orjson.loads(cli("turn", "show", new_turn, "--json"))
    assert replay_json["replayOf"] == spent[0].entry_id and replay_json["state"] == "succeeded"


def test_unknown_ids_are_one_line_and_exit_1(jobs: Any) -> None:
    assert "no turn 'nope'" in cli("turn", "show", "nope", exit_code=1)
    assert "`agentjobs turn list`" in cli("turn", "show", "nope", exit_code=1)
    assert "no dead-letter entry 'dl-nope'" in cli("dlq", "replay", "dl-nope", exit_code=1)
    missing = cli("conversation", "show", "c-none", exit_code=1)
    assert "no conversation 'c-none'" in missing and "--tenant" in missing


def test_turn_list_filters_and_orders_newest_first(jobs: Any) -> None:
    ok = [
        run_turn.delay(agent="demo", conversation_id=f"list-{n}", message=f"hi {n}")
        for n in range(3)
    ]
    for result in ok:
        result.get(timeout=30)
    failed = dead_lettered(agent="demo", conversation_id="list-0", message="no fail:401")
    failed_turn = failed.entry_id.removeprefix("dl-")
    listed = orjson.loads(cli("turn", "list", "--json"))
    assert [t["turnId"] for t in listed] == [failed_turn, *[r.id for r in reversed(ok)]]
    assert listed[0]["describe"] == f"dead-lettered as {failed.entry_id} (non_resumable)"
    assert "checkpoint" not in listed[0] and "payload" not in listed[0]
    by_state = orjson.loads(cli("turn", "list", "--state", "succeeded", "--json"))
    assert {t["turnId"] for t in by_state} == {r.id for r in ok}
    by_conversation = orjson.loads(cli("turn", "list", "--conversation", "list-0", "--json"))
    assert [t["turnId"] for t in by_conversation] == [failed_turn, ok[0].id]
    assert orjson.loads(cli("turn", "list", "--agent", "support", "--json")) == []
    limited = orjson.loads(cli("turn", "list", "--limit", "2", "--json"))
    assert [t["turnId"] for t in limited] == [failed_turn, ok[2].id]
    table = cli("turn", "list", env={"COLUMNS": "80"})
    assert all(len(line) <= 80 for line in table.splitlines()), table
    for result in ok:
        assert re.search(rf"^{result.id}\s+succeeded", table, re.M), table
    assert "4 turns, newest first." in table
    assert "no turns match" in cli("turn", "list", "--state", "queued")


def test_conversation_show_prints_the_stored_history_and_the_unfinished_turns(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="30", AGENTJOBS_BACKOFF_MAX_S="60")
    jobs.worker()
    jobs.pump()
    who = {"tenant": "acme", "principal": "ann"}
    for message in ("first question", "second question"):
        run_turn.delay(agent="demo", conversation_id="c-show", message=message, identity=who).get(
            timeout=30
        )
    # A turn that waits 15-30 s for its retry, and one queued behind it
    waiting = run_turn.delay(
        agent="demo", conversation_id="c-show", message="third fail:503x1", identity=who
    )
    behind = run_turn.delay(agent="demo", conversation_id="c-show", message="4th", identity=who)
    records = job_context().records
    wait_until(
        lambda: (r := records.get(waiting.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    shown = orjson.loads(
        cli("conversation", "show", "c-show", "--tenant", "acme", "--principal", "ann", "--json")
    )
    stored = load_conversation("c-show", who)
    assert stored is not None
    assert shown["stored"] is True and shown["turns"] == 2 and shown["historyLength"] == 4
    assert shown["lastRunId"] == stored.run_id and shown["turnNumber"] == stored.turn_number
    assert [m["content"] for m in shown["lastMessages"]] == [
        "first question",
        "Done: first question",
        "second question",
        "Done: second question",
    ]
    assert [(t["turnId"], t["state"]) for t in shown["unfinishedTurns"]] == [
        (waiting.id, "waiting"),
        (behind.id, "queued"),
    ]
    text = cli("conversation", "show", "c-show", "--tenant", "acme", "--principal", "ann")
    assert "2 turns" in text and "4 messages" in text and "  user: second question" in text
    assert f"{waiting.id}  waiting for retry (attempt 2)" in text
    # The same id without the identity is another conversation, which does not exist
    assert "no conversation 'c-show'" in cli("conversation", "show", "c-show", exit_code=1)


def test_conversation_show_says_how_many_earlier_messages_it_left_out(jobs: Any) -> None:
    # Given a conversation of four turns: eight messages
    for n in range(4):
        run_turn.delay(agent="demo", conversation_id="c-long", message=f"q{n}").get(timeout=30)
    # By default the last five are printed, after a line counting the three left out
    text = cli("conversation", "show", "c-long")
    assert "8 messages" in text
    assert "  ... 3 earlier messages not shown (--last N or --all shows more)" in text
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if "earlier messages not shown" in line)
    assert lines[start + 1 : start + 6] == [
        "  assistant: Done: q1",
        "  user: q2",
        "  assistant: Done: q2",
        "  user: q3",
        "  assistant: Done: q3",
    ]
    assert lines[start + 6] == "unfinished turns: 0"
    # --last N prints N, --all every one (and says nothing was left out)
    assert "  ... 7 earlier messages not shown" in cli(
        "conversation", "show", "c-long", "--last", "1"
    )
    every = cli("conversation", "show", "c-long", "--all")
    assert "not shown" not in every and "  user: q0" in every and "  assistant: Done: q3" in every
    assert "not shown" not in cli("conversation", "show", "c-long", "--last", "8")
    assert "not shown" not in cli("conversation", "show", "c-long", "--last", "50")
    assert "  ... 1 earlier message not shown" in cli(
        "conversation", "show", "c-long", "--last", "7"
    )
    # and --json gives the same messages under lastMessages: five by default
    as_json = orjson.loads(cli("conversation", "show", "c-long", "--json"))
    assert as_json["historyLength"] == 8
    assert as_json["lastMessages"][0]["content"] == "Done: q1"
    assert len(as_json["lastMessages"]) == 5
    all_json = orjson.loads(cli("conversation", "show", "c-long", "--all", "--json"))
    assert [m["content"] for m in all_json["lastMessages"]][:2] == ["q0", "Done: q0"]
    assert len(all_json["lastMessages"]) == 8
    none = orjson.loads(cli("conversation", "show", "c-long", "--last", "0", "--json"))
    assert none["lastMessages"] == [] and none["historyLength"] == 8
    refused = cli("conversation", "show", "c-long", "--all", "--last", "2", exit_code=2)
    assert "give --last N or --all, not both" in refused


def test_stats_counts_turns_and_dead_letters_and_the_pump_heartbeat(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="30", AGENTJOBS_BACKOFF_MAX_S="60")
    jobs.worker()
    jobs.pump()
    run_turn.delay(agent="demo", conversation_id="st-1", message="ok").get(timeout=30)
    dead_lettered(agent="nobody", conversation_id="st-2", message="x")
    dead_lettered(agent="demo", conversation_id="st-3", message="x fail:401")
    waiting = run_turn.delay(agent="demo", conversation_id="st-4", message="w fail:503x1")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(waiting.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    figures = orjson.loads(cli("stats", "--json"))
    assert figures["turns"] == {
        str(state): {"succeeded": 1, "dead_lettered": 2, "waiting": 1}.get(str(state), 0)
        for state in TurnState
    }
    assert figures["deadLetters"] == {
        "total": 2,
        "byReason": {"non_resumable": 1, "unknown_agent": 1},
    }
    assert figures["retriesDueNow"] == 0 and figures["retriesOverdue"] == 0
    assert figures["oldestQueuedAgeS"] is None and figures["oldestDueRetryAgeS"] is None
    assert 0 <= figures["pump"]["lastHeartbeatAgeS"] < 2 and not figures["pump"]["mayBeDown"]
    text = cli("stats")
    assert "succeeded 1" in text and "dead_lettered 2" in text and "waiting 1" in text
    assert "AGENTJOBS_RECORD_TTL_S" in text and "non_resumable 1, unknown_agent 1" in text
    assert "last tick" in text and "overdue" not in text


def test_stats_and_turn_show_say_the_pump_may_be_down_when_a_retry_is_overdue(
    make_jobs: Any,
) -> None:
    # Given a worker and no pump: a retry due in 0.2 s is never woken
    jobs = make_jobs()
    worker = jobs.worker()
    waiting = run_turn.delay(agent="demo", conversation_id="od-1", message="w fail:503x1")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(waiting.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    worker.stop()
    queued = run_turn.delay(agent="demo", conversation_id="od-2", message="q")
    time.sleep(1.0)  # over 5 pump intervals (0.1 s) past the retry's due time
    # Then stats counts it overdue, and says the pump may be down
    figures = orjson.loads(cli("stats", "--json"))
    assert figures["turns"]["waiting"] == 1 and figures["turns"]["queued"] == 1
    assert figures["retriesDueNow"] == 1 and figures["retriesOverdue"] == 1
    assert figures["oldestDueRetryAgeS"] >= 0.5 and figures["oldestQueuedAgeS"] >= 0.9
    assert figures["pump"] == {
        "lastHeartbeatMs": None,
        "lastHeartbeatAgeS": None,
        "mayBeDown": True,
    }
    text = cli("stats")
    assert "1 waiting turn due more than 0.5 s ago: the pump may be down" in text
    assert "`agentjobs pump`" in text and "no heartbeat" in text
    assert "is `agentjobs pump` up?" in cli("turn", "show", waiting.id)
    assert orjson.loads(cli("turn", "show", waiting.id, "--json"))["overdue"] is True
    # When the pump and a worker run again, both turns finish and nothing is overdue
    jobs.pump()
    jobs.worker()
    waiting.get(timeout=30)
    queued.get(timeout=30)
    after = orjson.loads(cli("stats", "--json"))
    assert after["turns"]["succeeded"] == 2 and after["retriesOverdue"] == 0
    assert not after["pump"]["mayBeDown"]
    assert "overdue" not in cli("stats")


# Commands that run until stopped.
PROCESSES = ("pump", "demo", "metrics", "web")


def operating_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Operating it", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def leaf_commands(group: Any, path: tuple[str, ...] = ()) -> list[str]:
    found = []
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found += leaf_commands(command, (*path, name))
        else:
            found.append(" ".join(("agentjobs", *path, name)))
    return found


def test_readme_operating_it_runs_as_written(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="1")
    jobs.worker()
    jobs.pump()
    # Given a store with conversation c-ops of tenant acme's ann and c-ops of nobody's, and
    # three dead letters
    who = {"tenant": "acme", "principal": "ann"}
    done = run_turn.delay(agent="demo", conversation_id="c-ops", message="hi", identity=who)
    done.get(timeout=30)
    run_turn.delay(agent="demo", conversation_id="c-ops", message="anonymous").get(timeout=30)
    spent = [
        dead_lettered(agent="demo", conversation_id=f"c-d{n}", message=f"x{n} fail:503x1")
        for n in range(2)
    ]
    dead_lettered(agent="nobody", conversation_id="c-u", message="x")
    values = {
        "S": "succeeded",
        "C": "c-ops",
        "A": "demo",
        "N": "10",
        "T": "acme",
        "P": "ann",
        "R": "max_attempts",
        "ID": spent[0].entry_id,
        "TURN_ID": done.id,
        "EVENT_ID": next(iter_events(done.id)).id,
        "AGENT": "demo",
        "CONVERSATION_ID": "c-submit",
        "MESSAGE": "hello",
        "SECONDS": "30",
        "DURATION": "1h",
    }
    lines = operating_lines()
    # Every command there is appears in README's block
    for command in leaf_commands(main):
        assert any(line.startswith(command) for line in lines), f"README lacks {command}"
    ran = []
    for line in lines:
        words = shlex.split(line)
        assert words[0] == "agentjobs", line
        if words[1] in PROCESSES:  # processes: tested by their own tests
            cli(words[1], "--help")
            continue
        if words[1:3] in (["turn", "approve"], ["turn", "reject"], ["turn", "answer"]):
            cli(*words[1:3], "--help")  # decisions need a paused turn: tests/tasks/test_pauses.py
            continue
        # When each line runs with its optional parts left out and with all of them
        bare = shlex.split(re.sub(r"\[[^\]]*\]", "", line))[1:]
        full = shlex.split(line.replace("[", "").replace("]", ""))[1:]
        for args in (bare, full):
            if args[:2] == ["dlq", "purge"] and "--yes" not in args:
                # Without a terminal to ask at (as here), purge deletes nothing without --yes
                refused = cli(*[values.get(word, word) for word in args], exit_code=1)
                assert "pass --yes" in refused, line
                ran.append(args)
                continue
            # Then it succeeds and prints something
            output = cli(*[values.get(word, word) for word in args])
            assert output.strip(), line
            ran.append(args)
    assert len(ran) >= 2 * (len(lines) - len(PROCESSES) - 3)
    # and the lines did what they say: every dead letter was replayed or purged
    assert orjson.loads(cli("dlq", "list", "--json")) == []
    assert job_context().records.get(spent[1].entry_id.removeprefix("dl-")).replayed_as
