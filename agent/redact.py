"""The redaction rules every layer shares: known secret values, key-shaped tokens, bearer and
basic tokens, credentials in URLs. Pure text in, text out.

The runtime applies them to the text of a tool's exception before the model, the history or a
hook sees it (`redact_tool_error`); the HTTP providers to a provider's error text
(agent/providers/_http.py); the job system to everything it stores or logs (tasks/core/redact.py,
which adds the values of the process's secret environment variables).

URLs: a tool's error keeps its URLs and loses only their credentials (the `user:password@`
part and the values of secret-named query parameters: `api_key=`, `token=`, `sig=`...). The
model reading it learns which endpoint failed, which helps it decide what to do next, and a
tool's URLs are the tool's own. The job system's stored errors and log lines lose whole URLs
(`redact_urls`): there a URL is most often one of our endpoints, which may be a private gateway.
A provider's endpoint is one of the provider's secrets, so it goes from tool errors too (a
provider with a `redact` method, agent/loop.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

REDACTED = "[redacted]"
REDACTED_KEY = "[redacted-key]"
REDACTED_SECRET = "[redacted-secret]"
REDACTED_URL = "[redacted-url]"

# An API key as OpenAI, Anthropic and their look-alikes write it (sk-..., sk-proj-...,
# sk-ant-...), also masked as servers echo it (`sk-proj-****abcd`): a masked key leaks its ends.
_KEY = re.compile(r"\bsk-[\w\-*.]{8,}")
# The credentials of an Authorization header; the scheme word stays, so the reader knows what
# was sent.
_AUTH_TOKEN = re.compile(r"\b([Bb]earer|Basic)(\s+)[A-Za-z0-9._~+/=-]{8,}")
# A URL does not end with the punctuation of the sentence around it.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,;:!?)\]]")
# `scheme://user:password@`: up to the last @ before the path, so a password holding an @ goes
# whole.
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/?#'\"<>]*@")
_SECRET_QUERY = re.compile(
    r"([?&;][\w.-]*?(?:key|token|secret|password|passwd|pwd|signature|sig|auth|credential)s?=)"
    r"[^&#;\s'\"<>]+",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=64)
def _literal_pattern(secrets: tuple[str, ...], ignore_case: bool) -> re.Pattern[str] | None:
    # Longest first: a secret that contains another goes whole.
    ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not ordered:
        return None
    return re.compile("|".join(map(re.escape, ordered)), re.IGNORECASE if ignore_case else 0)


def redact_values(
    text: str,
    secrets: Iterable[str],
    placeholder: str = REDACTED_SECRET,
    *,
    ignore_case: bool = False,
) -> str:
    """`text` with every occurrence of each of `secrets` replaced. Run before the pattern rules:
    a pattern that took part of a secret would leave the rest, no longer recognisable."""
    pattern = _literal_pattern(tuple(secrets), ignore_case)
    return text if pattern is None else pattern.sub(placeholder, text)


def redact_tokens(text: str, placeholder: str = REDACTED_KEY) -> str:
    """`text` without key-shaped tokens (sk-...) and Bearer/Basic credentials."""
    text = _KEY.sub(placeholder, text)
    return _AUTH_TOKEN.sub(rf"\1\2{placeholder}", text)


def redact_url_credentials(text: str, placeholder: str = REDACTED) -> str:
    """`text` with the credentials of its URLs replaced and the rest of each URL kept."""
    text = _URL_USERINFO.sub(rf"\1{placeholder}@", text)
    return _SECRET_QUERY.sub(rf"\1{placeholder}", text)


def redact_urls(text: str, placeholder: str = REDACTED_URL) -> str:
    """`text` with every URL replaced whole."""
    return _URL.sub(placeholder, text)


def redact_tool_error(text: str, secrets: Iterable[str] = ()) -> str:
    """A tool's exception text as the model may read it: `secrets`, key-shaped and bearer
    tokens and the credentials of URLs removed; the rest of each URL kept (module doc)."""
    text = redact_values(text, secrets)
    return redact_tokens(redact_url_credentials(text))


__all__ = [
    "REDACTED",
    "REDACTED_KEY",
    "REDACTED_SECRET",
    "REDACTED_URL",
    "redact_tokens",
    "redact_tool_error",
    "redact_url_credentials",
    "redact_urls",
    "redact_values",
]
