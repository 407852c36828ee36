"""Guarantees 7 and 8 (docs/jobs.md): secrets stay out of everything stored or logged, and no
pickle is accepted anywhere."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Exchange, Producer, Queue

from tasks import TurnDeadLettered, app, run_turn
from tasks.core.redact import process_secrets, redact, tool_error_redactor
from tasks.testing import redis_blob, wait_until
from tests.tasks.agents import LEAKY_TOOL_ENV

SECRET_KEY = "sk-test-7hHq2Ly0rVb9SECRETSECRET"
SECRET_URL = "https://gateway.internal.example/v1/chat"
TOOL_ENV_SECRET = "plain-gateway-token-without-shape-4711"
TOOL_SECRETS = (
    "sk-proj-Q3xT9vLm2NpR7sWk4YbZ8cDe",
    "sk-ant-api03-H8jK2mN5pQ7rT1vXy",
    "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.x",
    "hunter2-Pa55word",
    "svc-user",
    TOOL_ENV_SECRET,
)


def test_provider_errors_quoting_key_and_url_are_redacted_everywhere(make_jobs: Any) -> None:
    jobs = make_jobs(OPENAI_API_KEY=SECRET_KEY, AGENTJOBS_MAX_ATTEMPTS="2")
    jobs.worker()
    jobs.pump()
    refused = run_turn.delay(agent="leaky", conversation_id="c1", message="hi status:401")
    with pytest.raises(TurnDeadLettered) as caught:
        refused.get(timeout=30)
    assert caught.value.reason == "non_resumable"
    exhausted = run_turn.delay(agent="leaky", conversation_id="c2", message="hi")
    with pytest.raises(TurnDeadLettered) as caught_again:
        exhausted.get(timeout=30)
    assert caught_again.value.reason == "max_attempts"
    time.sleep(0.5)  # let the worker flush its log lines
    stored = redis_blob(jobs.redis)
    assert b"dl-" in stored, "the sweep must see the dead-letter entries"
    for secret in (SECRET_KEY, SECRET_URL, "gateway.internal.example"):
        assert secret.encode() not in stored
        assert secret not in jobs.logs()
        assert secret not in str(caught.value) and secret not in str(caught_again.value)
    assert "[redacted-secret]" in str(caught.value)


def test_a_tool_error_quoting_secrets_is_redacted_everywhere(make_jobs: Any) -> None:
    # Given a tool whose exception text quotes API keys, a bearer token, a URL with credentials
    # and the value of a secret environment variable of the worker, and a model that repeats
    # the tool's text in its answer
    jobs = make_jobs(**{LEAKY_TOOL_ENV: TOOL_ENV_SECRET})
    jobs.worker()

    # When a turn runs it
    result = run_turn.delay(agent="leaky_tool", conversation_id="c-tool", message="charge me")
    reply = result.get(timeout=30)

    # Then no secret is in any Redis value (conversation, record, journal, events, Celery
    # result), in the reply or in the logs
    time.sleep(0.5)  # let the worker flush its log lines
    stored = redis_blob(jobs.redis)
    assert b"charge of 5 failed" in stored, "the sweep must see the tool's message"
    shown = str(reply)
    for secret in TOOL_SECRETS:
        assert secret.encode() not in stored, secret
        assert secret not in shown, secret
        assert secret not in jobs.logs(), secret
    # and the model still learned what failed, and where
    assert shown.count("[redacted-key]") >= 3 and "[redacted-secret]" in shown
    assert "https://[redacted]@billing.internal.example/v2/charges" in shown


def test_redact_removes_keys_urls_and_secret_environment_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "plain-value-without-prefix-123")
    text = (
        "key sk-ant-abcdefghijklmnop, Bearer abc.def.ghi-jkl, url https://x.example/v1?k=1 "
        "and plain-value-without-prefix-123"
    )
    cleaned = redact(text)
    for secret in ("sk-ant-abcdefghijklmnop", "abc.def.ghi-jkl", "x.example", "plain-value"):
        assert secret not in cleaned
    assert cleaned.startswith("key [redacted-key]")


class _Exploit:
    """Unpickling this would create a file: the proof that pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_no_pickle_is_accepted_or_executed(jobs: Any, tmp_path: Path) -> None:
    assert set(app.conf.accept_content) == {"orjson", "json"}
    assert set(app.conf.result_accept_content) == {"orjson", "json"}
    assert app.conf.task_serializer == "orjson" and app.conf.event_serializer == "json"
    marker = tmp_path / "pwned"
    headers = {"lang": "py", "task": "tasks.run_turn", "id": "pickled-1", "argsrepr": "()"}
    body = ((), {"agent": "demo", "conversation_id": "p", "message": _Exploit(marker)}, {})
    with Connection(jobs.env["REDIS_URL"]) as connection:
        producer = Producer(connection)
        queue = Queue("agentjobs.turns", Exchange("agentjobs.turns"), "agentjobs.turns")
        producer.publish(
            pickle.dumps(body),
            content_type="application/x-python-serialize",
            content_encoding="binary",
            headers=headers,
            routing_key="agentjobs.turns",
            exchange=queue.exchange,
            declare=[queue],
        )
    wait_until(
        lambda: "ContentDisallowed" in jobs.logs() or "refused" in jobs.logs().lower(),
        20,
        "the worker to refuse the pickled message",
    )
    assert not marker.exists(), "a pickled message was executed"
    reply = run_turn.delay(agent="demo", conversation_id="after", message="fine")
    assert reply.get(timeout=30)["content"] == "Done: fine"


def test_a_tool_error_loses_secret_environment_values_and_url_credentials_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PAYMENTS_API_KEY", "plain-payments-key-0042")
    process_secrets.cache_clear()
    try:
        redactor = tool_error_redactor(None)
        text = "plain-payments-key-0042 refused at https://u:pw@pay.example/v1/charge (HTTP 401)"
        assert redactor(text) == (
            "[redacted-secret] refused at https://[redacted]@pay.example/v1/charge (HTTP 401)"
        )
        # a factory's own rules run after the process's, and never pile up turn after turn
        own = tool_error_redactor(lambda t: t.replace("pay.example", "[gateway]"))
        assert own(text).startswith("[redacted-secret] refused at https://[redacted]@[gateway]")
        assert tool_error_redactor(own) is own and tool_error_redactor(redactor) is redactor
    finally:
        process_secrets.cache_clear()
