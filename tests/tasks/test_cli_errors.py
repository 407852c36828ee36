"""The agentjobs command, run as an operator runs it (the console script, a subprocess), on
each expected failure: Redis unreachable, a bad setting, a bad argument. Each prints one or two
lines to stderr naming what is wrong and what to do, exits non-zero, never prints a traceback
or a password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.cli.errors import cli_wording, operator_message, redis_location
from tasks.core.errors import ActionConflict
from tasks.operate.people import _refusal
from tasks.testing import free_port, job_env

AGENTJOBS = str(Path(sys.executable).parent / "agentjobs")
PASSWORD = "hunter2-not-for-eyes"

# Every command that reads or writes the store, with arguments that would otherwise be fine.
STORE_COMMANDS = [
    ["stats"],
    ["stats", "--json"],
    ["turn", "list"],
    ["turn", "list", "--state", "waiting", "--json"],
    ["turn", "show", "t-1"],
    ["conversation", "show", "c-1", "--tenant", "acme"],
    ["dlq", "list"],
    ["dlq", "list", "--json"],
    ["dlq", "show", "dl-1"],
    ["dlq", "replay", "dl-1"],
    ["dlq", "replay", "--reason", "poison", "--all"],
    ["dlq", "purge", "--all", "--yes"],
]


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = job_env(f"redis://user:{PASSWORD}@127.0.0.1:{free_port()}/0")
    return subprocess.run(
        [AGENTJOBS, *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def assert_actionable(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done
    assert 1 <= len(lines) <= 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert PASSWORD not in done.stderr + done.stdout
    assert lines[0].startswith("agentjobs: "), done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=" ".join)
def test_redis_down_names_where_and_what_to_do(args: list[str]) -> None:
    # Given a REDIS_URL (with a password) pointing at a port nobody listens on
    port = free_port()
    url = f"redis://user:{PASSWORD}@127.0.0.1:{port}/0"
    # When the command runs
    done = run(args, REDIS_URL=url)
    # Then it says it cannot reach that Redis, why, and which variable to fix
    assert_actionable(done, f"cannot reach Redis at 127.0.0.1:{port} (Connection refused)")
    assert "REDIS_URL" in done.stderr
    assert done.returncode == 1


@pytest.mark.parametrize("args", [*STORE_COMMANDS, ["pump"]], ids=" ".join)
def test_a_bad_setting_is_named(args: list[str]) -> None:
    done = run(args, AGENTJOBS_LEASE_TTL_S="x")
    assert_actionable(done, "AGENTJOBS_LEASE_TTL_S must be a number of seconds > 0", "got 'x'")
    assert done.returncode == 1


def test_a_bad_redis_url_is_refused_without_quoting_it() -> None:
    done = run(["stats"], REDIS_URL=f"http://user:{PASSWORD}@example.com/0")
    assert_actionable(done, "REDIS_URL must be a redis:// or rediss:// or unix:// URL")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["dlq", "purge"], "--reason R, --older-than 7d (or both), or --all"),
        (["dlq", "purge", "--yes"], "say which entries to delete"),
        (["dlq", "purge", "--reason", ""], "'' is not one of 'max_attempts'"),
        (["dlq", "purge", "--reason", "nope"], "'nope' is not one of"),
        (["dlq", "purge", "--older-than", ""], "'' is not a duration"),
        (["dlq", "purge", "--older-than", "soon"], "'soon' is not a duration"),
        (["dlq", "purge", "--older-than", "0s"], "--all deletes every entry"),
        (["dlq", "purge", "--all", "--reason", "poison"], "leave out --reason"),
        (["dlq", "list", "--reason", "poisoned"], "'poisoned' is not one of"),
        (["dlq", "replay"], "give an entry ID, or --all"),
        (["dlq", "replay", "--reason", "poison"], "add --all to replay every poison entry"),
        (["dlq", "replay", "dl-1", "--all"], "not both"),
        (["turn", "list", "--state", "done"], "'done' is not one of 'queued'"),
        (["turn", "list", "--limit", "0"], "0 is not in the range x>=1"),
        (["turn", "list", "--agent", ""], "must not be empty"),
        (["turn", "show"], "Missing argument 'TURN_ID'"),
        (["conversation", "show", "c", "--tenant", " "], "must not be empty"),
        (["conversation", "show", "c", "--all", "--last", "2"], "give --last N or --all"),
        (["conversation", "show", "c", "--last", "-1"], "-1 is not in the range x>=0"),
        (["turn", "sho", "x"], "No such command 'sho'"),
        (["stats", "--jsn"], "--jsn"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_bad_argument_says_what_to_pass(args: list[str], expected: str) -> None:
    done = run(args)
    assert_actionable(done, expected, "--help` shows the options")
    assert done.returncode == 2


def test_version_is_the_installed_package_version() -> None:
    from importlib.metadata import version

    done = run(["--version"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"agentjobs {version('agentjobs')}\n"


def test_python_dash_m_behaves_as_the_console_script() -> None:
    env = {**job_env(f"redis://127.0.0.1:{free_port()}/0"), "AGENTJOBS_LEASE_TTL_S": "-1"}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "stats"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert_actionable(done, "AGENTJOBS_LEASE_TTL_S")


def test_redis_location_never_shows_credentials() -> None:
    assert redis_location(f"redis://u:{PASSWORD}@10.0.0.5:6380/2") == "10.0.0.5:6380"
    assert redis_location(f"rediss://:{PASSWORD}@cache.internal") == "cache.internal:6379"
    assert redis_location("unix:///run/redis.sock") == "unix socket /run/redis.sock"


@pytest.mark.parametrize(
    ("kind", "decision", "python", "command_line"),
    [
        (
            "approval",
            "answer",
            "an approval is decided with approve_action or reject_action, not answer_question",
            "an approval is decided with `agentjobs turn approve` or `agentjobs turn reject`, "
            "not `agentjobs turn answer`",
        ),
        (
            "question",
            "approve",
            "a question is decided with answer_question or reject_action, not approve_action",
            "a question is decided with `agentjobs turn answer` or `agentjobs turn reject`, "
            "not `agentjobs turn approve`",
        ),
    ],
)
def test_a_decision_of_the_wrong_kind_names_calls_in_python_and_commands_on_the_command_line(
    kind: str, decision: str, python: str, command_line: str
) -> None:
    # Given the refusal a Python caller gets (its type and code as ever)
    refused = ActionConflict("t-1", "req-1", _refusal("kind", [kind], decision))
    assert str(refused) == f"turn t-1, request req-1: {python}"
    assert refused.code == "ERR_ACTION_CONFLICT" and isinstance(refused, ValueError)
    # Then the command line prints it with its commands in place of the Python calls
    assert operator_message(refused) == (
        f"turn t-1, request req-1: {command_line}; `agentjobs turn pending` lists what waits "
        "for a decision"
    )


def test_edited_args_read_as_the_args_option_on_the_command_line() -> None:
    refused = ActionConflict("t-1", "req-1", "edited_args holds an integer beyond 64 bits")
    assert operator_message(refused) == (
        "turn t-1, request req-1: --args holds an integer beyond 64 bits; `agentjobs turn "
        "pending` lists what waits for a decision"
    )
    # Only whole names change: a word that merely holds one stays as it is
    assert cli_wording("my_edited_args_x and approve_actions") == (
        "my_edited_args_x and approve_actions"
    )
