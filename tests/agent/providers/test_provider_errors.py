"""Failures of both HTTP providers, over a real local server: typed errors, status, retry-after,
what can_resume makes of them, secrets kept out, and one pooled client per provider."""

from __future__ import annotations

import email.utils
import socket
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from provider_servers import ANTHROPIC_KEY, OPENAI_KEY, ScriptedServer

from agent.errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderResponseError,
    ProviderTimeoutError,
    can_resume,
    not_resumable_reason,
)
from agent.messages import LLMRequest
from agent.providers._http import parse_retry_after
from agent.providers.anthropic import AnthropicProvider
from agent.providers.openai import OpenAIChatProvider

REQUEST = LLMRequest(
    system_prompt="", messages=[{"role": "user", "content": "hi"}], tools=[], model="m"
)


def make_openai(origin: str, timeout_s: float = 5.0) -> OpenAIChatProvider:
    return OpenAIChatProvider(
        "gpt-test", base_url=f"{origin}/v1", api_key=OPENAI_KEY, timeout_s=timeout_s
    )


def make_anthropic(origin: str, timeout_s: float = 5.0) -> AnthropicProvider:
    return AnthropicProvider(
        "claude-test", api_key=ANTHROPIC_KEY, base_url=origin, timeout_s=timeout_s
    )


OPENAI_OK = {
    "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
}
ANTHROPIC_OK = {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}

Maker = Callable[..., Any]
KINDS: dict[str, tuple[Maker, dict[str, Any], str]] = {
    "openai": (make_openai, OPENAI_OK, OPENAI_KEY),
    "anthropic": (make_anthropic, ANTHROPIC_OK, ANTHROPIC_KEY),
}


def error_body(kind: str, message: str, type_: str) -> dict[str, Any]:
    if kind == "openai":
        return {"error": {"message": message, "type": type_, "param": None, "code": None}}
    return {"type": "error", "error": {"type": type_, "message": message}}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


HTTPProvider = OpenAIChatProvider | AnthropicProvider


def provider_for(kind: str, server: ScriptedServer, timeout_s: float = 5.0) -> HTTPProvider:
    make, _, _ = KINDS[kind]
    provider: HTTPProvider = make(server.origin, timeout_s)
    return provider


def failure(provider: HTTPProvider) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        provider.complete(REQUEST)
    return info.value


@pytest.mark.parametrize(
    ("status", "headers", "retry_after_s", "reason"),
    [
        (429, {"retry-after": "7"}, 7.0, None),
        (429, {"retry-after-ms": "1500", "retry-after": "9"}, 1.5, None),
        (503, {}, None, None),
        (500, {}, None, None),
        (529, {"retry-after": "2"}, 2.0, None),
        (408, {}, None, None),
        (409, {}, None, None),
        (401, {}, None, "auth"),
        (403, {}, None, "auth"),
        (400, {}, None, "malformed-request"),
        (404, {}, None, "malformed-request"),
        (422, {}, None, "malformed-request"),
    ],
)
def test_error_status_maps_to_typed_error_and_resume_class(
    kind: str,
    server: ScriptedServer,
    status: int,
    headers: dict[str, str],
    retry_after_s: float | None,
    reason: str | None,
) -> None:
    # Given a provider API answering with an error status
    server.reply(status, error_body(kind, "something went wrong", "api_error"), headers=headers)

    # When the provider is called
    err = failure(provider_for(kind, server))

    # Then the error carries the status and wait, and can_resume classifies it per
    # docs/checkpoint.md, "Resumability"
    assert type(err) is ProviderHTTPError
    assert err.status == status
    assert err.retry_after_s == retry_after_s
    assert not_resumable_reason(err) == reason
    assert can_resume(err) is (reason is None)
    assert f"HTTP {status}" in str(err) and "something went wrong" in str(err)
    assert str(err).startswith(f"{kind} provider:")


def test_retry_after_as_http_date(kind: str, server: ScriptedServer) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.reply(
        429, error_body(kind, "slow down", "rate_limit_error"), headers={"retry-after": when}
    )

    err = failure(provider_for(kind, server))

    assert err.retry_after_s is not None and 25 <= err.retry_after_s <= 30


def test_slow_answer_is_a_resumable_timeout(kind: str, server: ScriptedServer) -> None:
    _, ok, _ = KINDS[kind]
    server.reply(200, ok, delay_s=1.5)
    provider = provider_for(kind, server, timeout_s=0.3)

    started = time.monotonic()
    err = failure(provider)

    assert time.monotonic() - started < 1.2
    assert type(err) is ProviderTimeoutError
    assert err.status is None and err.retry_after_s is None
    assert can_resume(err)
    assert err.__context__ is None and err.__cause__ is None  # httpx's request holds the key


def test_refused_connection_is_a_resumable_connection_error(kind: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    make, _, _ = KINDS[kind]
    provider = make(f"http://127.0.0.1:{port}")

    err = failure(provider)

    assert type(err) is ProviderConnectionError
    assert err.status is None
    assert can_resume(err)
    assert err.__context__ is None and err.__cause__ is None
    assert str(port) not in str(err)


@pytest.mark.parametrize("raw", [b'{"choices": [', b"<html>Bad gateway</html>", b"[1, 2]"])
def test_2xx_that_is_not_a_json_object_is_a_response_error(
    kind: str, server: ScriptedServer, raw: bytes
) -> None:
    server.reply(200, raw=raw)

    err = failure(provider_for(kind, server))

    assert type(err) is ProviderResponseError
    assert err.status == 200


def test_error_text_never_holds_the_key_or_the_endpoint(kind: str, server: ScriptedServer) -> None:
    # Given servers that echo the credentials and the URL back in their error text
    _, _, key = KINDS[kind]
    echo = (
        f"Incorrect API key provided: {key} (masked {key[:8]}****{key[-4:]}) at {server.origin}/v1"
    )
    server.reply(401, error_body(kind, echo, "authentication_error"))
    server.reply(502, raw=f"<html>upstream {server.host_port} said: {key}</html>".encode())
    server.reply(200, raw=f"not json {key} {server.origin}".encode())
    provider = provider_for(kind, server)

    # When each call fails
    errors = [failure(provider) for _ in range(3)]

    # Then neither the key, nor a fragment of it, nor the host shows anywhere an operator looks
    for err in errors:
        shown = " ".join(
            [str(err), repr(err), repr(err.args), repr(vars(err)), *traceback.format_exception(err)]
        )
        assert key not in shown
        assert key[-12:] not in shown
        assert "127.0.0.1" not in shown
        assert str(server.origin.rsplit(":", 1)[1]) not in shown
        assert "[redacted]" in shown
    assert not_resumable_reason(errors[0]) == "auth"


def test_repr_of_provider_hides_the_key(kind: str, server: ScriptedServer) -> None:
    provider = provider_for(kind, server)
    _, _, key = KINDS[kind]

    assert key not in repr(provider) and key not in str(provider)
    assert "model=" in repr(provider)


def test_one_connection_serves_consecutive_calls(kind: str, server: ScriptedServer) -> None:
    _, ok, _ = KINDS[kind]
    server.reply(200, ok)
    server.reply(429, error_body(kind, "busy", "rate_limit_error"))
    server.reply(200, ok)
    provider = provider_for(kind, server)

    provider.complete(REQUEST)
    with pytest.raises(ProviderHTTPError):
        provider.complete(REQUEST)
    provider.complete(REQUEST)

    ports = {received.client_port for received in server.received}
    assert len(server.received) == 3 and len(ports) == 1


def test_close_releases_the_connection_and_the_provider_still_works(
    kind: str, server: ScriptedServer
) -> None:
    _, ok, _ = KINDS[kind]
    server.reply(200, ok)
    server.reply(200, ok)
    provider = provider_for(kind, server)

    provider.complete(REQUEST)
    provider.close()
    response = provider.complete(REQUEST)

    assert response.content == "ok"
    assert server.received[0].client_port != server.received[1].client_port


def test_concurrent_calls_from_threads_share_one_provider(
    kind: str, server: ScriptedServer
) -> None:
    _, ok, _ = KINDS[kind]
    for _ in range(16):
        server.reply(200, ok, delay_s=0.05)
    provider = provider_for(kind, server)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: provider.complete(REQUEST).content, range(16)))

    assert answers == ["ok"] * 16
    # Pooled: at most one connection per concurrent worker, not one per call.
    assert len({received.client_port for received in server.received}) <= 8


class TestParseRetryAfter:
    def test_milliseconds_win_over_seconds(self) -> None:
        assert parse_retry_after({"retry-after-ms": "250", "retry-after": "3"}) == 0.25

    def test_fractional_seconds(self) -> None:
        assert parse_retry_after({"retry-after": "1.5"}) == 1.5

    def test_http_date_in_the_past_is_zero(self) -> None:
        assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0

    def test_http_date_relative_to_now(self) -> None:
        now_s = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:27:00 GMT").timestamp()
        headers = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
        assert parse_retry_after(headers, now_s=now_s) == 60.0

    @pytest.mark.parametrize(
        "headers",
        [{}, {"retry-after": "soon"}, {"retry-after": "-3"}, {"retry-after": "nan"}],
    )
    def test_absent_or_unreadable_is_none(self, headers: dict[str, str]) -> None:
        assert parse_retry_after(headers) is None

    def test_bad_milliseconds_fall_back_to_seconds(self) -> None:
        assert parse_retry_after({"retry-after-ms": "x", "retry-after": "4"}) == 4.0
