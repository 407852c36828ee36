"""OpenTelemetry spans of real turns on a real worker (telemetry/tracing.py): one trace per turn
across its retry, the GenAI names and attributes, parents and children, and content only when
AGENTJOBS_OTEL_CAPTURE_CONTENT=1. The worker's tracer provider is set by its agent module
(tests/tasks/traced_agents.py) and writes each span to a file the test reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tasks import run_turn
from tasks.queue.context import job_context
from tasks.testing import wait_until
from tests.conftest import ROOT

TRACED = "traced=tests.tasks.traced_agents:build_traced_agent"
# A tool round, then a 503 (a retry), then the answer: two attempts, three model calls, one tool.
SPANS_OF_THE_TURN = 6


def traced_jobs(make_jobs: Any, spans: Path, **env: str) -> Any:
    jobs = make_jobs(AGENTJOBS_AGENTS=TRACED, AGENTJOBS_TEST_SPANS=str(spans), **env)
    jobs.worker()
    jobs.pump()
    return jobs


def read_spans(path: Path, count: int) -> list[dict[str, Any]]:
    def lines() -> list[bytes]:
        return path.read_bytes().splitlines() if path.exists() else []

    wait_until(lambda: len(lines()) >= count, 15, f"{count} spans in {path}")
    spans = [orjson.loads(line) for line in lines()]
    return sorted(spans, key=lambda s: s["startNs"])


def named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"].startswith(prefix)]


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[str]:
    return [s["name"] for s in spans if s["parentId"] == parent["spanId"]]


def test_a_turn_with_a_tool_round_and_a_503_retry_is_one_trace_in_its_submitters(
    make_jobs: Any, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    traced_jobs(make_jobs, spans_file)
    # Given a submitter inside a span of its own (an HTTP request's, say)
    submitter = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with trace.use_span(NonRecordingSpan(submitter)):
        result = run_turn.delay(agent="traced", conversation_id="c-t1", message="Where is A-17?")
    # When its turn runs a tool round, fails with a 503 and succeeds on its second attempt
    assert result.get(timeout=30)["attempts"] == 2
    spans = read_spans(spans_file, SPANS_OF_THE_TURN)
    # Then every span is in the submitter's trace
    assert len(spans) == SPANS_OF_THE_TURN, [s["name"] for s in spans]
    assert {s["traceId"] for s in spans} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    # and each attempt is a span under the submitter's, with the GenAI agent attributes
    first, second = named(spans, "invoke_agent")
    for number, attempt in enumerate((first, second), start=1):
        assert attempt["name"] == "invoke_agent traced"
        assert attempt["parentId"] == "00f067aa0ba902b7"
        assert attempt["attributes"] == {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "traced",
            "gen_ai.conversation.id": "c-t1",
            "agentjobs.turn.id": result.id,
            "agentjobs.attempt": number,
            "agentjobs.delivery": 1,
            "agentjobs.outcome": "retry" if number == 1 else "succeed",
            **({"error.type": "ProviderHTTPError"} if number == 1 else {}),
        }
    assert (first["status"], second["status"]) == ("ERROR", "UNSET")
    # with its model calls and tool calls as children, in the order they ran
    assert children(spans, first) == [
        "chat test-model",
        "execute_tool lookup_order",
        "chat test-model",
    ]
    assert children(spans, second) == ["chat test-model"]
    answered, overloaded, resumed = named(spans, "chat")
    assert answered["kind"] == "CLIENT"
    assert answered["attributes"] == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "test-llm",
        "gen_ai.request.model": "test-model",
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 3,
        "agentjobs.iteration": 1,
    }
    assert overloaded["attributes"]["error.type"] == "ProviderHTTPError"
    assert overloaded["status"] == "ERROR"
    assert "gen_ai.usage.input_tokens" not in overloaded["attributes"]
    assert resumed["attributes"]["gen_ai.usage.output_tokens"] == 6
    (tool_span,) = named(spans, "execute_tool")
    assert tool_span["attributes"] == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup_order",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function",
        "agentjobs.tool.attempt": 1,
        "agentjobs.tool.effect": "read_only",
    }
    assert tool_span["status"] == "UNSET"
    # and no message content is in any span
    written = spans_file.read_text()
    for text in ("Where is A-17", "shipped", "A-17"):
        assert text not in written


def test_without_a_submitters_trace_the_first_attempt_starts_one_and_content_is_opt_in(
    make_jobs: Any, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    traced_jobs(make_jobs, spans_file, AGENTJOBS_OTEL_CAPTURE_CONTENT="1")
    # Given a turn submitted outside any span, with content capture on
    result = run_turn.delay(agent="traced", conversation_id="c-t2", message="Where is A-17?")
    assert result.get(timeout=30)["attempts"] == 2
    spans = read_spans(spans_file, SPANS_OF_THE_TURN)
    # Then the first attempt is the trace's root and the retry joins its trace, under it
    first, second = named(spans, "invoke_agent")
    assert first["parentId"] is None
    assert {s["traceId"] for s in spans} == {first["traceId"]}
    assert second["parentId"] == first["spanId"]
    # and the content is on the spans: the message, the answer, the tool's arguments and result
    assert orjson.loads(first["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Where is A-17?"}]}
    ]
    assert orjson.loads(second["attributes"]["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "A-17 has shipped."}]}
    ]
    (tool_span,) = named(spans, "execute_tool")
    assert orjson.loads(tool_span["attributes"]["gen_ai.tool.call.arguments"]) == {
        "order_id": "A-17"
    }
    assert orjson.loads(tool_span["attributes"]["gen_ai.tool.call.result"]) == {
        "orderId": "A-17",
        "status": "shipped",
    }
    # and the record keeps the context the attempts joined
    record = job_context().records.get(result.id)
    assert record is not None and first["spanId"] in record.trace


def test_without_opentelemetry_a_worker_runs_turns_and_records_no_trace(
    make_jobs: Any, tmp_path: Path
) -> None:
    # Given a worker whose Python cannot import opentelemetry (as without the `otel` extra)
    blocker = tmp_path / "no_otel"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['opentelemetry'] = None\n")
    jobs = make_jobs()
    jobs.worker(env={"PYTHONPATH": f"{blocker}:{ROOT}"})
    jobs.pump()
    probe = (
        "import tasks.telemetry.tracing as t; "
        "print(t.OTEL_AVAILABLE, t.tracing(), repr(t.current_trace()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**jobs.env, "PYTHONPATH": f"{blocker}:{ROOT}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["False", "False", "''"]
    # When a turn with a tool round and a retry runs there
    result = run_turn.delay(agent="demo", conversation_id="c-t3", message="hi rounds:1 fail:503x1")
    # Then it succeeds as ever, and its record holds no trace context
    assert result.get(timeout=30)["attempts"] == 2
    record = job_context().records.get(result.id)
    assert record is not None and record.trace == ""
