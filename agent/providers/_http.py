"""What the HTTP providers share: one pooled client, error mapping, retry-after, redaction.

Every failure leaves here as a ProviderError subclass whose message, args and attributes hold
neither the API key nor the endpoint URL: provider error text is redacted before it is quoted
(the rules of agent/redact.py, plus the key and every spelling of the endpoint), and httpx
exceptions (whose `.request` carries the auth header) are never chained.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from agent.errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderResponseError,
    ProviderTimeoutError,
)
from agent.redact import REDACTED, redact_tokens, redact_url_credentials, redact_values

# Longest provider text quoted in an error message (after redaction, so a cut never exposes a
# fragment of a secret).
MAX_QUOTED_CHARS = 500


def parse_retry_after(headers: Mapping[str, str], now_s: float | None = None) -> float | None:
    """Seconds to wait, from `retry-after-ms` (ms) or `retry-after` (seconds or an HTTP date)."""
    millis = _finite_non_negative(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _finite_non_negative(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less parse means "-0000"
        return None
    now = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - now)


def _finite_non_negative(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


class Redactor:
    """Replaces the key and every spelling of the endpoint (URL, host:port, host) in text, then
    key-shaped and bearer tokens (servers echo keys, sometimes masked: `sk-proj-****abcd`) and
    the credentials of other URLs."""

    def __init__(self, api_key: str | None, urls: Sequence[str]) -> None:
        secrets: set[str] = set()
        if api_key:
            secrets.add(api_key)
        for url in urls:
            parts = urlsplit(url)
            secrets.update({url, url.rstrip("/"), parts.netloc, parts.hostname or ""})
        self._secrets = tuple(sorted(s for s in secrets if s))

    def __repr__(self) -> str:
        return "<Redactor>"

    def __call__(self, text: str) -> str:
        # Host names are case-insensitive, and a server may echo one in capitals.
        text = redact_values(text, self._secrets, REDACTED, ignore_case=True)
        return redact_tokens(redact_url_credentials(text, REDACTED), REDACTED)

    def quote(self, text: str) -> str:
        redacted = self(text)
        if len(redacted) > MAX_QUOTED_CHARS:
            redacted = redacted[:MAX_QUOTED_CHARS] + "..."
        return redacted


def check_base_url(base_url: str, source: str) -> str:
    """The base URL without a trailing slash; the error names `source`, never the value."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{source} must be an http:// or https:// URL")
    return base_url.strip().rstrip("/")


def check_api_key(api_key: str, source: str) -> str:
    key = api_key.strip()
    # A header value must be visible ASCII; httpx/h11 would otherwise quote it in their error.
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ValueError(f"{source} contains characters that cannot go in an HTTP header")
    return key


def check_timeout(timeout_s: float) -> float:
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


class JSONEndpoint:
    """POSTs JSON to one URL through one lazily created, thread-safe, pooled httpx.Client."""

    def redact(self, text: str) -> str:
        """`text` without this endpoint's key and URLs (for text quoted from elsewhere, such
        as a tool's error: agent/loop.py)."""
        return self._redact(text)

    def __init__(
        self,
        *,
        provider: str,
        url: str,
        headers: Mapping[str, str],
        timeout_s: float,
        redactor: Redactor,
        key_source: str,
    ) -> None:
        self._provider = provider
        self._url = url
        self._headers = {**headers, "content-type": "application/json"}
        self._timeout_s = timeout_s
        self._redact = redactor
        self._key_source = key_source
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JSONEndpoint {self._provider}>"

    def client(self) -> httpx.Client:
        with self._lock:  # two threads on a fresh provider must not build two pools
            if self._client is None:
                self._client = httpx.Client(
                    headers=self._headers, timeout=httpx.Timeout(self._timeout_s)
                )
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The decoded JSON object of a 2xx answer, or a ProviderError."""
        payload = orjson.dumps(body)
        client = self.client()
        failure: ProviderError
        try:
            response = client.post(self._url, content=payload)
        except httpx.TimeoutException as exc:
            failure = ProviderTimeoutError(
                f"{self._provider} provider: no answer within {self._timeout_s:g}s "
                f"({type(exc).__name__}); the call can be retried"
            )
        except httpx.TransportError as exc:
            failure = ProviderConnectionError(
                f"{self._provider} provider: connection failed ({type(exc).__name__}: "
                f"{self._redact.quote(str(exc))}); check the network or the base URL, then retry"
            )
        except httpx.HTTPError as exc:  # decoding errors, too many redirects
            failure = ProviderResponseError(
                f"{self._provider} provider: unreadable answer ({type(exc).__name__}: "
                f"{self._redact.quote(str(exc))})"
            )
        else:
            return self._decode(response)
        # Raised outside the except blocks so the httpx exception is not kept as __context__.
        raise failure

    def _decode(self, response: httpx.Response) -> dict[str, Any]:
        status = response.status_code
        if not 200 <= status < 300:
            raise self._status_error(response)
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            raise ProviderResponseError(
                f"{self._provider} provider: HTTP {status} answer is not a JSON object: "
                f"{self._redact.quote(response.text)!r}",
                status=status,
            )
        return data

    def _status_error(self, response: httpx.Response) -> ProviderHTTPError:
        status = response.status_code
        retry_after_s = parse_retry_after(response.headers)
        detail = _error_detail(response.content)
        quoted = self._redact.quote(detail) if detail else ""
        return ProviderHTTPError(
            f"{self._provider} provider: HTTP {status}"
            + (f": {quoted}" if quoted else "")
            + f"; {self._advice(status, retry_after_s)}",
            status=status,
            retry_after_s=retry_after_s,
        )

    def _advice(self, status: int, retry_after_s: float | None) -> str:
        if status in (401, 403):
            return f"check the API key ({self._key_source}) and its permissions"
        if status == 429:
            wait = f"after {retry_after_s:g}s" if retry_after_s is not None else "later"
            return f"rate limited; retry {wait}"
        if status in (408, 409) or status >= 500:
            return "the provider failed or is overloaded; the call can be retried"
        return "the provider refused the request; sending it again unchanged will fail the same way"


def _error_detail(content: bytes) -> str:
    """`type/code: message` from an OpenAI- or Anthropic-shaped error body, else the raw text.

    The provider's code and type stay in the text because can_resume reads the message:
    `context_length_exceeded` and "prompt is too long" mean "do not retry".
    """
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode("utf-8", errors="replace").strip()
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return content.decode("utf-8", errors="replace").strip()
    labels = [str(error[k]) for k in ("type", "code") if isinstance(error.get(k), str | int)]
    message = error.get("message")
    text = message if isinstance(message, str) else ""
    return f"{'/'.join(labels)}: {text}" if labels else text
