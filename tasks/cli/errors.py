"""What the `agentjobs` command prints for an expected failure: one line on stderr,
`agentjobs: <what is wrong>; <what to do>`, and a non-zero exit status, never a traceback.

AgentjobsGroup, the root command's class, maps these once for every subcommand:

    redis.ConnectionError, TimeoutError   cannot reach Redis at host:port (why); REDIS_URL
    redis.AuthenticationError             the credentials in REDIS_URL were refused
    redis.RedisError (any other)          Redis refused the command (READONLY, OOM, ...)
    kombu OperationalError                cannot reach the Celery broker; CELERY_BROKER_URL
    SettingsError                         the variable and what it must be
    ReplayError, LookupError              an unknown id or an unreadable dead-letter entry,
                                          worded where it is raised (not KeyError, IndexError:
                                          those are bugs)
    UnreadableRecord                      a damaged turn record, and how to get rid of it
    ActionConflict                        a decision that cannot be recorded, and why, the
                                          Python calls it names put as commands
    click.UsageError                      a bad argument, and which `--help` to read

Anything else is a bug and keeps its traceback. No message shows a URL's user or password.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click
import redis
from kombu.exceptions import OperationalError as BrokerUnreachable

from tasks.core.errors import ActionConflict, UnreadableRecord
from tasks.core.settings import SettingsError
from tasks.core.state_url import parse_state_url
from tasks.queue.context import job_context
from tasks.store.dead_letters import ReplayError

_USERINFO = re.compile(r"(\w[\w+.-]*://)[^/@\s]*@")


def redis_location(url: str) -> str:
    """host:port (or the socket path) of a Redis URL: never its user or password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix socket {parts.path}"
    try:
        return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
    except ValueError:  # a port that is not a number
        return parts.hostname or "(the host in REDIS_URL)"


def _configured_redis() -> str:
    try:
        settings = job_context().settings
    except SettingsError:
        return "(REDIS_URL)"
    if settings.state_url == settings.redis_url:
        return redis_location(settings.redis_url)
    # AGENTJOBS_STATE_URL's store: a cluster, a Sentinel master, or another Redis.
    return parse_state_url(settings.state_url).describe()


def _why(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    text = str(exc).rstrip(".")
    return text.rsplit(". ", 1)[-1] if ". " in text else text


def operator_message(exc: BaseException) -> str | None:
    """What a person should read for an expected failure; None for anything else (a bug)."""
    if isinstance(exc, redis.RedisError | BrokerUnreachable):
        return _unreachable_message(exc)
    return _job_message(exc)


def _unreachable_message(exc: redis.RedisError | BrokerUnreachable) -> str:
    """A failure of Redis or the broker: where it was (never the credentials), and why."""
    if isinstance(exc, redis.AuthenticationError):
        return (
            f"Redis at {_configured_redis()} refused the credentials ({_why(exc)}); check the "
            "user and password in REDIS_URL"
        )
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return (
            f"cannot reach Redis at {_configured_redis()} ({_why(exc)}); is it running? "
            "REDIS_URL sets where"
        )
    if isinstance(exc, redis.RedisError):
        return f"Redis at {_configured_redis()} refused the command: {exc}"
    return (
        f"cannot reach the Celery broker ({_why(exc)}); is it running? CELERY_BROKER_URL "
        "(default: REDIS_URL) sets where"
    )


def _job_message(exc: BaseException) -> str | None:
    """A failure the job system worded: a setting, a decision, a damaged record, an unknown
    id; None for any other exception."""
    if isinstance(exc, SettingsError):
        return f"bad setting: {exc}; fix it in the environment and run again"
    if isinstance(exc, ActionConflict):
        return f"{cli_wording(str(exc))}; `agentjobs turn pending` lists what waits for a decision"
    if isinstance(exc, UnreadableRecord):
        return (
            f"turn record {exc.turn_id!r} is unreadable ({exc.problem}); the job system skips "
            "it: repair or delete its key with redis-cli"
        )
    if isinstance(exc, ReplayError | LookupError) and not isinstance(exc, KeyError | IndexError):
        return str(exc.args[0]) if exc.args else type(exc).__name__
    return None


# The Python names a decision's refusal (ActionConflict, tasks/operate/people.py) is worded
# with, and what does the same on the command line.
_CLI_NAMES = {
    "approve_action": "`agentjobs turn approve`",
    "reject_action": "`agentjobs turn reject`",
    "answer_question": "`agentjobs turn answer`",
    "edited_args": "--args",
}
_PYTHON_NAME = re.compile(r"\b(" + "|".join(_CLI_NAMES) + r")\b")


def cli_wording(text: str) -> str:
    """`text` with the Python calls and arguments it names replaced by the commands and
    options a person at the command line uses instead."""
    return _PYTHON_NAME.sub(lambda found: _CLI_NAMES[found[1]], text)


class Failure(click.ClickException):
    """An expected failure, already worded for a person."""


def _fail(message: str, exit_code: int) -> NoReturn:
    click.echo("agentjobs: " + _USERINFO.sub(r"\1", message), err=True)
    sys.exit(exit_code)


class AgentjobsGroup(click.Group):
    """The root command: expected failures of any subcommand become one or two lines."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            message = operator_message(exc)
            if message is None:
                raise
            raise Failure(message) from None

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "agentjobs"
            _fail(f"{exc.format_message()} (`{where} --help` shows the options)", exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("aborted", 1)
        sys.exit(code if isinstance(code, int) else 0)
