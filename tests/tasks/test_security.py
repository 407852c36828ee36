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
from tasks.redact import redact
from tasks.testing import redis_blob, wait_until

SECRET_KEY = "sk-test-7hHq2Ly0rVb9SECRETSECRET"
SECRET_URL = "https://gateway.internal.example/v1/chat"


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
