"""What the HTTP providers share: one pooled client, error mapping, retry-after, redaction, and
the Server-Sent Events of a streamed answer.

Every failure leaves here as a ProviderError subclass whose message, args and attributes hold
neither the API key nor the endpoint URL: provider error text is redacted before it is quoted
(the rules of agent/redact.py, plus the key and every spelling of the endpoint), and httpx
exceptions (whose `.request` carries the auth header) are never chained.

A stream fails as a whole call does: an HTTP refusal before it starts is the same
ProviderHTTPError, an error object inside it is the ProviderHTTPError its type would have come
with as a status, and a stream that stalls or breaks mid-reply is a resumable
ProviderTimeoutError or ProviderConnectionError.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import orjson
from httpx_sse import EventSource, ServerSentEvent

from agent.errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderResponseError,
    ProviderTimeoutError,
)
from agent.messages import LLMResponse, StreamChunk, stream_response
from agent.redact import REDACTED, redact_tokens, redact_url_credentials, redact_values

# Longest provider text quoted in an error message (after redaction, so a cut never exposes a
# fragment of a secret).
MAX_QUOTED_CHARS = 500

_STREAM_HEADERS = {"accept": "text/event-stream", "cache-control": "no-store"}

# The HTTP status each error type (or OpenAI code) of Anthropic's and OpenAI's APIs comes with,
# so that an error object inside a stream (no status of its own) is classified as that refusal.
_ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "api_error": 500,
    "server_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


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


class StreamedReply(Protocol):
    """A provider's reply put back together from its stream's events, in the shape of the
    whole answer its `parse_response` reads."""

    def add(self, event: ServerSentEvent) -> str | None:
        """Takes one event in: the answer text it adds, or None at the stream's end marker."""

    def whole(self) -> dict[str, Any]:
        """The reply as a whole (non-streamed) answer would have carried it."""


class JSONEndpoint:
    """POSTs JSON to one URL through one lazily created, thread-safe, pooled httpx.Client, and
    reads the answer whole (`post`) or as Server-Sent Events (`stream`)."""

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
        failure: ProviderError
        try:
            response = self.client().post(self._url, content=orjson.dumps(body))
        except httpx.HTTPError as exc:
            failure = self._transport_failure(exc, mid_reply=False)
        else:
            return self._decode(response)
        # Raised outside the except blocks so the httpx exception is not kept as __context__.
        raise failure

    def stream(
        self,
        body: Mapping[str, Any],
        reply: StreamedReply,
        parse: Callable[[Mapping[str, Any]], LLMResponse],
    ) -> Iterator[StreamChunk]:
        """The text of `reply` as its events arrive, then `parse` of the whole of it, so the
        last chunk holds what `post` and `parse` would have made of the same reply. A server
        that ignores `stream` and answers with one JSON object is read as `post` reads it.

        `timeout_s` bounds the connection and each wait between two pieces of the answer, as
        it does for `post`, so a long reply is never cut for its length."""
        # Closed with this generator, so a reader that stops early frees the connection now.
        with contextlib.closing(self._events(body)) as events:
            for event in events:
                if isinstance(event, dict):
                    yield from stream_response(parse(event))
                    return
                text = reply.add(event)
                if text is None:
                    response = parse(reply.whole())
                    # What follows the end marker is the end of the body: read, the connection
                    # goes back to the pool instead of being closed. Nothing is lost if it fails.
                    with contextlib.suppress(ProviderError):
                        for _ in events:
                            pass
                    yield StreamChunk("", response)
                    return
                if text:
                    yield StreamChunk(text)
        raise ProviderConnectionError(
            f"{self._provider} provider: the stream ended before the reply was complete; "
            "the call can be retried"
        )

    def _events(self, body: Mapping[str, Any]) -> Generator[ServerSentEvent | dict[str, Any]]:
        """The events of a 2xx event-stream answer as they arrive (or the one JSON object of
        a 2xx JSON answer), or a ProviderError."""
        failure: ProviderError
        mid_reply = False
        try:
            with self.client().stream(
                "POST", self._url, content=orjson.dumps(body), headers=_STREAM_HEADERS
            ) as response:
                if not response.is_success:
                    response.read()
                    raise self._status_error(response)
                content_type = response.headers.get("content-type", "").partition(";")[0]
                if content_type.strip() != "text/event-stream":
                    response.read()
                    yield self._decode(response)
                    return
                mid_reply = True
                yield from EventSource(response).iter_sse()
                return
        except httpx.HTTPError as exc:
            failure = self._transport_failure(exc, mid_reply=mid_reply)
        raise failure

    def event_data(self, event: ServerSentEvent) -> dict[str, Any]:
        """The JSON object an event carries ({} for an event without data, a keep-alive). An
        error object (Anthropic's `error` event, OpenAI's `{"error": ...}` chunk) raises as
        the refusal of its type would."""
        if not event.data.strip():
            return {}
        data = self._json_object(
            event.data, event.data, what=f"a stream event ({event.event})", status=200
        )
        error = data.get("error")
        if isinstance(error, dict):
            raise self._stream_error(error)
        return data

    def _transport_failure(self, exc: httpx.HTTPError, *, mid_reply: bool) -> ProviderError:
        name = type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            if mid_reply:
                return ProviderTimeoutError(
                    f"{self._provider} provider: the stream stalled, nothing arrived within "
                    f"{self._timeout_s:g}s ({name}); the call can be retried"
                )
            return ProviderTimeoutError(
                f"{self._provider} provider: no answer within {self._timeout_s:g}s "
                f"({name}); the call can be retried"
            )
        quoted = self._redact.quote(str(exc))
        if isinstance(exc, httpx.TransportError):
            if mid_reply:
                return ProviderConnectionError(
                    f"{self._provider} provider: the connection broke mid-reply ({name}: "
                    f"{quoted}); the call can be retried"
                )
            return ProviderConnectionError(
                f"{self._provider} provider: connection failed ({name}: "
                f"{quoted}); check the network or the base URL, then retry"
            )
        # Decoding errors, too many redirects.
        return ProviderResponseError(
            f"{self._provider} provider: unreadable answer ({name}: {quoted})"
        )

    def _json_object(
        self, raw: bytes | str, shown: str, *, what: str, status: int
    ) -> dict[str, Any]:
        """`raw` as a JSON object, or a ProviderResponseError quoting `shown`, redacted."""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            raise ProviderResponseError(
                f"{self._provider} provider: {what} is not a JSON object: "
                f"{self._redact.quote(shown)!r}",
                status=status,
            )
        return data

    def _decode(self, response: httpx.Response) -> dict[str, Any]:
        status = response.status_code
        if not 200 <= status < 300:
            raise self._status_error(response)
        data = self._json_object(
            response.content, response.text, what=f"HTTP {status} answer", status=status
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

    def _stream_error(self, error: Mapping[str, Any]) -> ProviderHTTPError:
        status = _error_status(error)
        detail = _error_text(error)
        quoted = self._redact.quote(detail) if detail else "no detail"
        return ProviderHTTPError(
            f"{self._provider} provider: error in the stream: {quoted}; "
            f"{self._advice(status, None)}",
            status=status,
        )

    def _advice(self, status: int | None, retry_after_s: float | None) -> str:
        if status is None:
            return "the provider failed mid-reply; the call can be retried"
        if status in (401, 403):
            return f"check the API key ({self._key_source}) and its permissions"
        if status == 429:
            wait = f"after {retry_after_s:g}s" if retry_after_s is not None else "later"
            return f"rate limited; retry {wait}"
        if status in (408, 409) or status >= 500:
            return "the provider failed or is overloaded; the call can be retried"
        return "the provider refused the request; sending it again unchanged will fail the same way"


def _error_detail(content: bytes) -> str:
    """`type/code: message` from an OpenAI- or Anthropic-shaped error body, else the raw text."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return content.decode("utf-8", errors="replace").strip()
    return _error_text(error)


def _error_text(error: Mapping[str, Any]) -> str:
    """`type/code: message` of an error object.

    The provider's code and type stay in the text because can_resume reads the message:
    `context_length_exceeded` and "prompt is too long" mean "do not retry".
    """
    labels = [str(error[k]) for k in ("type", "code") if isinstance(error.get(k), str | int)]
    message = error.get("message")
    text = message if isinstance(message, str) else ""
    return f"{'/'.join(labels)}: {text}" if labels else text


def _error_status(error: Mapping[str, Any]) -> int | None:
    """The HTTP status an error object stands for: a numeric code, else its code's or type's."""
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    for label in (code, error.get("type")):
        if isinstance(label, str) and label in _ERROR_TYPE_STATUS:
            return _ERROR_TYPE_STATUS[label]
    return None
