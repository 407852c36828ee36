"""Keep secrets out of everything the job system stores or logs: API keys, endpoint URLs and
the values of the process's secret environment variables.

The rules are agent/redact.py's; this module adds the process's secrets. `redact` is for what
the job system writes itself (errors, log lines): whole URLs go. `redact_tool_error` is what
the runtime applies to a tool's exception text in a worker (tasks/turn/registry.py gives it to
every agent it builds): a URL there loses only its credentials, so the model still learns
which endpoint failed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from agent import redact as rules
from tasks.core.settings import secret_values


@functools.cache
def process_secrets() -> tuple[str, ...]:
    """This process's secret values, read once: every log line is redacted, and reading the
    environment for each one cost a short turn 5% of its worker time. Cleared with the job
    context (tasks.queue.context.reset)."""
    return tuple(secret_values())


def redact(text: str) -> str:
    """`text` with URLs, key-shaped tokens and the values of secret environment variables
    replaced by placeholders."""
    text = rules.redact_values(text, process_secrets(), rules.REDACTED_SECRET)
    return rules.redact_tokens(rules.redact_urls(text))


def redact_tool_error(text: str) -> str:
    """A tool's exception text without this process's secrets, key-shaped tokens and the
    credentials of URLs (the rest of each URL kept)."""
    return rules.redact_tool_error(text, process_secrets())


@dataclass(frozen=True)
class _ThenOwn:
    own: Callable[[str], str]

    def __call__(self, text: str) -> str:
        return self.own(redact_tool_error(text))


def tool_error_redactor(own: Callable[[str], str] | None) -> Callable[[str], str]:
    """What an agent built for a turn redacts its tools' exception text with: this process's
    secrets first, then `own` (its factory's `redact_tool_errors`, if any); the runtime's own
    rules run after both. A factory that hands out the same agent every time gets it back
    unchanged, not wrapped once more per turn."""
    if own is None:
        return redact_tool_error
    if own is redact_tool_error or isinstance(own, _ThenOwn):
        return own
    return _ThenOwn(own)


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def log_redacted() -> None:
    """A process of ours (the pump, the exporters, the console) logs at INFO to stderr, every
    line through RedactingFilter."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
