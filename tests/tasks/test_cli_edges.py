"""The agentjobs command at its hard edges (docs/operations.md, "Hard edges"): a damaged
dead-letter entry or turn record stops no listing, show or bulk replay of the others; `dlq
purge` deletes only what a person confirmed or `--yes` allowed; text from models, tools and
people is printed as it is, never read as markup."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from tasks import run_turn
from tasks.cli import main
from tasks.queue.context import job_context
from tasks.testing import wait_until
from tests.tasks.test_cli import cli, dead_lettered

AGENTJOBS = str(Path(sys.executable).parent / "agentjobs")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_failure(result: Result) -> str:
    """A failure's stderr, checked to be one or two `agentjobs: ` lines and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code != 0, result.output
    assert 1 <= len(lines) <= 2 and lines[0].startswith("agentjobs: "), result.stderr
    assert "Traceback" not in result.output
    return result.stderr


# -- damaged entries ------------------------------------------------------------------------------


def _keys_of(entry_id: str) -> tuple[Any, str]:
    """The shard keys and the turn key of a dead-letter entry (read before it is damaged)."""
    entry = job_context().dead_letters.summary(entry_id)
    assert entry is not None
    shard = job_context().keys.for_namespace(entry["namespace"])
    return shard, shard.turn(entry["taskId"])


def _rewrite_summary(change: Callable[[dict[str, Any]], Any]) -> Callable[[Any, str, str], None]:
    def damage(redis: Any, entry_id: str, turn_key: str) -> None:
        shard, _ = _keys_of(entry_id)
        summary = orjson.loads(redis.hget(shard.dead_letters, entry_id))
        redis.hset(shard.dead_letters, entry_id, orjson.dumps(change(summary)))

    return damage


def _raw_summary(raw: bytes) -> Callable[[Any, str, str], None]:
    def damage(redis: Any, entry_id: str, turn_key: str) -> None:
        shard, _ = _keys_of(entry_id)
        redis.hset(shard.dead_letters, entry_id, raw)

    return damage


def _without(summary: dict[str, Any], field: str) -> dict[str, Any]:
    summary.pop(field)
    return summary


# (damage, whether the table sees it: it reads summaries and small record fields only)
DAMAGES: dict[str, tuple[Callable[[Any, str, str], None], bool]] = {
    "summary not JSON": (_raw_summary(b"{not json"), True),
    "summary a JSON list": (_raw_summary(b"[1, 2]"), True),
    "summary without taskId": (_rewrite_summary(lambda s: _without(s, "taskId")), True),
    "summary with a text time": (_rewrite_summary(lambda s: {**s, "lastFailedAtMs": "x"}), True),
    "record gone": (lambda redis, entry_id, turn_key: redis.delete(turn_key), True),
    "record without state": (lambda redis, entry_id, turn_key: redis.hdel(turn_key, "state"), True),
    "checkpoint not JSON": (
        lambda redis, entry_id, turn_key: redis.hset(turn_key, "checkpoint", b"{oops"),
        False,
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_one_unreadable_entry_is_named_and_the_others_list_show_and_replay(
    jobs: Any, damage: str
) -> None:
    # Given three dead letters, the middle one damaged
    first = dead_lettered(agent="nobody", conversation_id="ok-1", message="x").entry_id
    bad = dead_lettered(agent="nobody", conversation_id="bad", message="x").entry_id
    last = dead_lettered(agent="nobody", conversation_id="ok-2", message="x").entry_id
    _, turn_key = _keys_of(bad)
    harm, table_sees_it = DAMAGES[damage]
    harm(jobs.redis, bad, turn_key)

    # When they are listed, the damaged one is an entry of its own that says it is unreadable
    listed = orjson.loads(cli("dlq", "list", "--json"))
    assert [e["id"] for e in listed] == [first, bad, last]
    assert set(listed[1]) == {"id", "unreadable"} and listed[1]["unreadable"]
    assert listed[0]["reason"] == listed[2]["reason"] == "unknown_agent"
    table = cli("dlq", "list")
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.split()}
    assert first in rows and last in rows and bad in rows, table
    assert ("unreadable" in rows[bad]) is table_sees_it, table
    assert "3 entries" in table

    # Then the others show as before, and the damaged one says so in one line
    assert "unknown_agent" in cli("dlq", "show", first)
    assert orjson.loads(cli("dlq", "show", last, "--json"))["id"] == last
    for args in (("dlq", "show", bad), ("dlq", "show", bad, "--json")):
        refused = one_line_failure(invoke(*args))
        assert f"dead-letter entry {bad!r} is unreadable" in refused
    assert "dead-lettered as" in cli("turn", "show", first.removeprefix("dl-"))

    # and a bulk replay replays the rest and names what it skipped
    replayed = invoke("dlq", "replay", "--all")
    skipped = one_line_failure(replayed)
    assert f"replayed {first} as turn " in replayed.stdout
    assert f"replayed {last} as turn " in replayed.stdout
    assert bad in skipped and "skipped 1 entry" in skipped, skipped
    assert bad not in replayed.stdout.replace(f"skipped {bad}", "")
    refused = one_line_failure(invoke("dlq", "replay", bad))
    assert "unreadable" in refused
    assert bad in [e["id"] for e in orjson.loads(cli("dlq", "list", "--json"))]


def test_turn_show_of_an_unreadable_record_is_one_line_and_others_still_show(jobs: Any) -> None:
    good = run_turn.delay(agent="demo", conversation_id="r-1", message="fine")
    good.get(timeout=30)
    bad = run_turn.delay(agent="demo", conversation_id="r-2", message="hurt")
    bad.get(timeout=30)
    record = job_context().records.get(bad.id)
    assert record is not None
    turn_key = job_context().keys.for_namespace(record.namespace).turn(bad.id)
    jobs.redis.hset(turn_key, "state", "melted")

    hurt = run_turn.delay(agent="demo", conversation_id="r-3", message="scratched")
    hurt.get(timeout=30)
    scratched = job_context().records.get(hurt.id)
    assert scratched is not None
    jobs.redis.hset(
        job_context().keys.for_namespace(scratched.namespace).turn(hurt.id), "checkpoint", b"{x"
    )

    refused = one_line_failure(invoke("turn", "show", bad.id))
    assert f"turn record {bad.id!r} is unreadable" in refused
    assert "succeeded" in cli("turn", "show", good.id)
    # A damaged checkpoint still lets the rest of its record show, and says so
    shown = cli("turn", "show", hurt.id)
    assert "succeeded" in shown and "unreadable" in shown, shown
    assert orjson.loads(cli("turn", "show", hurt.id, "--json"))["checkpointUnreadable"]


def test_purge_removes_unreadable_entries_by_age_and_with_all(jobs: Any) -> None:
    broken = dead_lettered(agent="nobody", conversation_id="p-1", message="x").entry_id
    _raw_summary(b"garbage")(jobs.redis, broken, "")
    # An unreadable entry has no reason to match, but its index still dates it
    assert "purged 0 entries" in cli("dlq", "purge", "--reason", "unknown_agent", "--yes")
    assert "purged 1 entry." in cli("dlq", "purge", "--older-than", "0.001s", "--yes")
    again = dead_lettered(agent="nobody", conversation_id="p-2", message="x").entry_id
    _raw_summary(b"[]")(jobs.redis, again, "")
    assert "purged 1 entry." in cli("dlq", "purge", "--all", "--yes")
    assert orjson.loads(cli("dlq", "list", "--json")) == []


# -- purge asks first -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [("--all",), ("--reason", "unknown_agent"), ("--older-than", "1s")],
    ids=" ".join,
)
def test_purge_without_a_terminal_needs_yes(jobs: Any, args: tuple[str, ...]) -> None:
    dead_lettered(agent="nobody", conversation_id="y-1", message="x")
    refused = one_line_failure(invoke("dlq", "purge", *args))  # CliRunner's stdin is no TTY
    assert "--yes" in refused
    assert len(orjson.loads(cli("dlq", "list", "--json"))) == 1
    assert "purged" in cli("dlq", "purge", *args, "--yes")


def _purge_on_a_terminal(env: dict[str, str], answer: bytes, *args: str) -> Any:
    """`agentjobs dlq purge ARGS` with a terminal as its stdin, answering `answer`."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [AGENTJOBS, "dlq", "purge", *args],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        os.write(controller, answer)
        out, err = process.communicate(timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    return process.returncode, out, err


def test_purge_on_a_terminal_asks_how_many_and_deletes_only_on_yes(jobs: Any) -> None:
    for n in range(2):
        dead_lettered(agent="nobody", conversation_id=f"t-{n}", message="x")
    other = dead_lettered(agent="demo", conversation_id="t-x", message="x fail:401").entry_id
    # When the operator says no, nothing is deleted
    code, out, err = _purge_on_a_terminal(jobs.env, b"n\n", "--reason", "unknown_agent")
    assert code != 0 and "Traceback" not in err
    assert "2 dead-letter entries" in out, out
    assert "nothing deleted" in err, err
    assert len(orjson.loads(cli("dlq", "list", "--json"))) == 3
    # When the operator says yes, those entries go and the others stay
    code, out, err = _purge_on_a_terminal(jobs.env, b"y\n", "--reason", "unknown_agent")
    assert code == 0, err
    assert "2 dead-letter entries" in out and "purged 2 entries." in out, out
    assert [e["id"] for e in orjson.loads(cli("dlq", "list", "--json"))] == [other]


# -- text is printed literally ----------------------------------------------------------------


def test_model_text_with_markup_is_printed_literally(jobs: Any) -> None:
    text = "[/bold] [redacted-url] [bold red]loud :smile:"
    result = run_turn.delay(agent="demo", conversation_id="mk", message=text)
    assert result.get(timeout=30)["content"] == f"Done: {text}"
    shown = cli("turn", "show", result.id, env={"COLUMNS": "400"})
    assert f"Done: {text}" in shown, shown


def test_redaction_placeholders_in_errors_are_printed_literally(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="30", AGENTJOBS_BACKOFF_MAX_S="60")
    jobs.worker()
    # A dead letter whose error quoted a URL, shown by `dlq show`
    entry = dead_lettered(agent="leaky", conversation_id="lk", message="status:401").entry_id
    error = job_context().dead_letters.summary(entry)["error"]  # type: ignore[index]
    assert "[redacted-url]" in error
    assert error in cli("dlq", "show", entry, env={"COLUMNS": "400"})
    # and a turn waiting out a retry of such an error, shown by `turn show`
    waiting = run_turn.delay(agent="leaky", conversation_id="lk-2", message="again")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(waiting.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    last_error = records.get(waiting.id).last_error  # type: ignore[union-attr]
    assert "[redacted-url]" in last_error
    assert last_error in cli("turn", "show", waiting.id, env={"COLUMNS": "400"})
