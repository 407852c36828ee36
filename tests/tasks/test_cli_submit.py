"""`agentjobs submit` against a real job system (a worker and the pump): the turn id at once, the
reply alone with --wait, the result as JSON, a refusal that queues nothing, the one line of a
dead-lettered, cancelled or late turn, and --timeout giving up while the turn goes on. And the
root command's -h, -V and `version`; and, run as the console script, one line for a Redis that
is down or a bad setting."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tasks import app, cancel_turn, load_conversation
from tasks.cli import main
from tasks.operate.inspect import list_turns
from tasks.queue.context import job_context
from tasks.testing import free_port, job_env, wait_until
from tests.tasks.test_cli import cli

AGENTJOBS = str(Path(sys.executable).parent / "agentjobs")
PASSWORD = "hunter2-never-printed"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def turn_named_in(line: str) -> str:
    found = re.search(rf"turn ({UUID})", line)
    assert found, line
    return found[1]


def test_submit_prints_the_turn_id_at_once_and_the_turn_runs(jobs: Any) -> None:
    output = cli("submit", "demo", "c-s1", "hello")
    # Given only the id on stdout
    assert re.fullmatch(rf"{UUID}\n", output), output
    turn_id = output.strip()
    # Then that turn runs to its reply
    assert app.AsyncResult(turn_id).get(timeout=30)["content"] == "Done: hello"
    # and --json without --wait gives the id as an object
    as_json = orjson.loads(cli("submit", "demo", "c-s1", "again", "--json"))
    assert set(as_json) == {"turnId"} and re.fullmatch(UUID, as_json["turnId"])
    assert app.AsyncResult(as_json["turnId"]).get(timeout=30)["turnNumber"] == 2


def test_wait_prints_only_the_reply_and_json_only_the_result(jobs: Any) -> None:
    assert cli("submit", "demo", "c-s2", "hi there", "--wait") == "Done: hi there\n"
    result = orjson.loads(
        cli(
            "submit",
            *("demo", "c-s2", "and now?"),
            *("--tenant", "acme", "--principal", "ann"),
            *("--deadline", "2m", "--wait", "--timeout", "30", "--json"),
        )
    )
    assert result["content"] == "Done: and now?" and result["conversationId"] == "c-s2"
    # The identity scoped it: a conversation of its own, turn 1 there
    assert result["turnNumber"] == 1 and result["attempts"] == 1
    stored = load_conversation("c-s2", identity={"tenant": "acme", "principal": "ann"})
    assert stored is not None
    assert [m["content"] for m in stored.history] == ["and now?", "Done: and now?"]
    # and --deadline gave the turn its deadline (read while it runs: an ended turn has none)
    turn_id = cli("submit", "demo", "c-s2", "think:2", "--deadline", "90").strip()
    record = job_context().records.get(turn_id)
    assert record is not None and record.deadline_at_ms - record.created_at_ms == 90_000
    assert app.AsyncResult(turn_id).get(timeout=30)["content"] == "Done: think:2"


def test_a_refused_submission_is_one_line_and_queues_nothing(jobs: Any) -> None:
    for args, problem in (
        (("demo", "c-s3", "   "), "MESSAGE must not be empty or whitespace only"),
        (("demo", "c-s3", "x", "--deadline", "0"), "--deadline must be a finite number"),
        (("demo", "c-s3", "x", "--deadline", "30d"), "--deadline must be at most 604800 s"),
    ):
        refused = cli("submit", *args, exit_code=1)
        assert f"agentjobs: refused, nothing was queued: {problem}" in refused, refused
    # Nothing was registered or published
    assert list_turns(job_context(), conversation_id="c-s3") == []
    assert not [key for key in jobs.redis.scan_iter() if b":turn:" in key]
    assert jobs.redis.llen(job_context().settings.turn_queue) == 0
    # A bad argument is the command line's own refusal (exit 2)
    assert "--timeout needs --wait" in cli(
        "submit", "demo", "c-s3", "x", "--timeout", "5", exit_code=2
    )


def test_wait_on_a_dead_letter_exits_1_naming_the_turn_and_the_reason(jobs: Any) -> None:
    failed = cli("submit", "demo", "c-s4", "x fail:401", "--wait", exit_code=1)
    turn_id = turn_named_in(failed)
    assert f"dead-lettered as dl-{turn_id} (non_resumable)" in failed, failed
    assert f"`agentjobs dlq show dl-{turn_id}`" in failed
    record = job_context().records.get(turn_id)
    assert record is not None and record.state == "dead_lettered"
    # --json changes nothing about a failure: one line on stderr, no JSON
    assert "(unknown_agent)" in cli(
        "submit", "nobody", "c-s4", "y", "--wait", "--json", exit_code=1
    )


def test_wait_on_a_turn_past_its_deadline_says_it_missed_it(jobs: Any) -> None:
    late = cli("submit", "demo", "c-s5", "think:5", "--deadline", "1", "--wait", exit_code=1)
    turn_id = turn_named_in(late)
    assert f"turn {turn_id} missed its deadline: dead-lettered as" in late, late
    assert "(deadline_exceeded)" in late


def test_wait_on_a_cancelled_turn_exits_1_with_the_cancel_reason(jobs: Any) -> None:
    # Given a turn cancelled by someone else while the command waits for it
    def cancel_once_running() -> None:
        def running() -> list[Any]:
            turns = list_turns(job_context(), conversation_id="c-s6", state="running")
            return turns

        wait_until(running, 20, "the turn to run")
        cancel_turn(running()[0].turn_id, reason="changed my mind")

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    cancelled = cli("submit", "demo", "c-s6", "think:10", "--wait", exit_code=1)
    canceller.join()
    turn_id = turn_named_in(cancelled)
    assert f"turn {turn_id} was cancelled (changed my mind)" in cancelled, cancelled


def test_timeout_gives_up_with_exit_2_and_the_turn_goes_on(jobs: Any) -> None:
    gave_up = cli("submit", "demo", "c-s7", "think:2", "--wait", "--timeout", "0.5", exit_code=2)
    turn_id = turn_named_in(gave_up)
    assert f"turn {turn_id} has not ended after 0.5 s; it goes on" in gave_up, gave_up
    assert f"`agentjobs turn watch {turn_id}`" in gave_up
    assert app.AsyncResult(turn_id).get(timeout=30)["content"] == "Done: think:2"


def test_message_dash_reads_standard_input(jobs: Any) -> None:
    result = CliRunner().invoke(
        main, ["submit", "demo", "c-s8", "-", "--wait"], input="from a pipe\n"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "Done: from a pipe\n"


def test_help_and_version_options_and_the_version_command() -> None:
    for option in ("-h", "--help"):
        assert cli(option).startswith("Usage: agentjobs [OPTIONS] COMMAND")
    assert "--wait" in cli("submit", "-h") and "--json" in cli("agents", "-h")
    expected = f"agentjobs {version('agentjobs')}\n"
    assert cli("-V") == cli("--version") == cli("version") == expected


@pytest.mark.parametrize(
    "args",
    [["submit", "demo", "c", "x"], ["submit", "demo", "c", "x", "--wait"], ["agents"]],
    ids=" ".join,
)
def test_the_console_script_fails_in_one_line(args: list[str]) -> None:
    # Given a Redis nobody listens on (submit) or a bad setting (agents reads only settings)
    port = free_port()
    env = job_env(f"redis://user:{PASSWORD}@127.0.0.1:{port}/0")
    if args == ["agents"]:
        env["AGENTJOBS_LEASE_TTL_S"] = "x"
    done = subprocess.run(
        [AGENTJOBS, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    # Then one line says what is wrong, with exit 1, no traceback and no password
    assert done.returncode == 1 and done.stdout == "", done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and PASSWORD not in done.stderr
    expected = "AGENTJOBS_LEASE_TTL_S must be" if args == ["agents"] else f"127.0.0.1:{port}"
    assert done.stderr.startswith("agentjobs: ") and expected in done.stderr, done.stderr
