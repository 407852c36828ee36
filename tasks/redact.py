"""Keep secrets out of everything the job system stores or logs: API keys and endpoint URLs."""

from __future__ import annotations

import functools
import logging
import re

from tasks.settings import secret_values

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_KEYISH = re.compile(
    r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{8,}|(?:Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,})"
)


@functools.cache
def process_secrets() -> tuple[str, ...]:
    """This process's secret values, read once: every log line is redacted, and reading the
    environment for each one cost a short turn 5% of its worker time. Cleared with the job
    context (tasks.context.reset)."""
    return tuple(secret_values())


def redact(text: str) -> str:
    """`text` with URLs, key-shaped tokens and the values of secret environment variables
    replaced by placeholders."""
    for secret in process_secrets():
        text = text.replace(secret, "[redacted-secret]")
    text = _URL.sub("[redacted-url]", text)
    return _KEYISH.sub("[redacted-key]", text)


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
