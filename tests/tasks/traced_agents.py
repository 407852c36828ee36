"""An agent whose worker traces (tests/tasks/test_telemetry.py). Importing this module sets the
worker's tracer provider, as an application does in the module of its agent factories (README,
"Telemetry"): the OpenTelemetry SDK with an exporter that appends every span, as it ends, as
one JSON line to the file named by AGENTJOBS_TEST_SPANS, where the test reads them."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from agent import Agent, LLMRequest, LLMResponse, ProviderHTTPError, ToolCall, tool

SPANS_FILE = "AGENTJOBS_TEST_SPANS"
MODEL = "test-model"


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
        "parentId": format(span.parent.span_id, "016x") if span.parent else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "startNs": span.start_time,
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = b"".join(orjson.dumps(span_dict(span)) + b"\n" for span in spans)
        with self._lock, self._path.open("ab") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


if os.environ.get(SPANS_FILE):
    _provider = TracerProvider()
    _provider.add_span_processor(
        SimpleSpanProcessor(JsonLinesExporter(Path(os.environ[SPANS_FILE])))
    )
    trace.set_tracer_provider(_provider)


@tool(effect="read_only")
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by id."""
    return {"orderId": order_id, "status": "shipped"}


class ToolThenOverloaded:
    """Asks for lookup_order, then is overloaded (503) once, then answers; reports usage."""

    name = "test-llm"

    def complete(self, request: LLMRequest) -> LLMResponse:
        if not any(m.get("role") == "tool" for m in request.messages):
            call = ToolCall(id="call_1", name="lookup_order", args={"order_id": "A-17"})
            return LLMResponse(tool_calls=[call], usage={"inputTokens": 11, "outputTokens": 3})
        message = str(request.messages[0]["content"])
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        if int(client.incr(f"traced:{message}:answers")) == 1:
            raise ProviderHTTPError("the model is overloaded (HTTP 503)", status=503)
        return LLMResponse(
            content="A-17 has shipped.", usage={"inputTokens": 20, "outputTokens": 6}
        )


def build_traced_agent() -> Agent:
    return Agent(provider=ToolThenOverloaded(), model=MODEL, tools=[lookup_order], id="traced")
