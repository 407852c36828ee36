"""OpenTelemetry spans of turns (docs/operations.md, "Telemetry"), with the GenAI semantic
conventions' names, so a trace backend shows agentjobs' turns as it shows other agents':

    <the submitter's span, when run_turn.delay was called inside one>
      invoke_agent <agent>        one attempt of a turn (a retry, a takeover, a handover: another)
        chat <model>              one model call
        execute_tool <tool>       one tool call (parallel calls run in other threads: their
                                  parent is passed explicitly, never taken from the thread)

Every attempt of a turn is in one trace. run_turn.delay keeps the submitter's W3C trace context
in the turn record (`trace`, with the registration), and every attempt's span is its child.
Without one, the first attempt's span is a root, and its context is kept in the record (a fenced
write, once per turn) for the later attempts to be its children. Keeping it in the record, not in
message headers, is what carries it across retries, takeovers and handovers: their messages are
new wake-ups, sent by the pump or another worker.

Active when `opentelemetry-api` is importable (the `otel` extra) and the process set a tracer
provider (README, "Telemetry"). Otherwise each attempt gets None, and every hook of the turn
costs one None check. Message content is only on the spans with
AGENTJOBS_OTEL_CAPTURE_CONTENT=1, redacted like everything else the job system stores.
Telemetry never fails a turn: an error of its own is logged once and the turn goes on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import orjson
import redis

from agent import ModelCallPhase, ModelCallReport, ResponseReport, ToolCallPhase, ToolCallReport
from tasks.core.redact import redact

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    OTEL_AVAILABLE = True
except ImportError:  # the `otel` extra is not installed: no span, no cost
    OTEL_AVAILABLE = False

if TYPE_CHECKING:
    from tasks.queue.context import JobContext
    from tasks.store.records import TurnRecord

logger = logging.getLogger("agentjobs.telemetry")
TRACER_NAME = "agentjobs"
# error.type of a span still open when its attempt stopped (a handover, a lost lease).
INTERRUPTED = "interrupted"

_P = ParamSpec("_P")
_R = TypeVar("_R")
_warned = threading.Event()


def _never_raises(method: Callable[_P, _R]) -> Callable[_P, _R | None]:
    """Telemetry must not fail a turn: log its first error, then go on without it."""

    @functools.wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        try:
            return method(*args, **kwargs)
        except Exception:
            if not _warned.is_set():
                _warned.set()
                logger.warning("telemetry failed (the turn goes on)", exc_info=True)
            return None

    return guarded


def tracing() -> bool:
    """Whether spans would go anywhere: the API is installed and a tracer provider is set."""
    if not OTEL_AVAILABLE:
        return False
    provider = otel_trace.get_tracer_provider()
    return not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)


@_never_raises
def current_trace() -> str:
    """The caller's current trace context as a JSON carrier (traceparent, tracestate), for the
    turn record; "" outside a span or without OpenTelemetry."""
    if not OTEL_AVAILABLE or not otel_trace.get_current_span().get_span_context().is_valid:
        return ""
    return _carrier_of(otel_context.get_current())


def _carrier_of(context: Any) -> str:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context)
    return orjson.dumps(carrier).decode()


def _context_of(trace: str) -> Any:
    """The context kept in a turn record, or None (then the span is a root, or a child of what
    is current in the worker, such as a Celery instrumentation's span)."""
    if not trace:
        return None
    carrier = orjson.loads(trace)
    return TraceContextTextMapPropagator().extract(carrier) if isinstance(carrier, dict) else None


@contextlib.contextmanager
def attempt(ctx: JobContext, record: TurnRecord, token: str) -> Iterator[AttemptTrace | None]:
    """The span of one claimed attempt, for the turn's hooks (None when not tracing). It is
    current in this thread while the attempt runs, so an instrumented HTTP client's spans in
    the same thread nest under it."""
    trace = _start(ctx, record, token) if tracing() else None
    if trace is None:
        yield None
        return
    attached = otel_context.attach(trace.context)
    try:
        yield trace
    finally:
        otel_context.detach(attached)
        trace.end()


@_never_raises
def _start(ctx: JobContext, record: TurnRecord, token: str) -> AttemptTrace:
    tracer = otel_trace.get_tracer(TRACER_NAME)
    trace = AttemptTrace(tracer, _context_of(record.trace), record, ctx.settings)
    if not record.trace:
        # The first attempt without a submitter's trace: later attempts join this one's.
        # Redis gone: the attempt itself finds out at its next write.
        with contextlib.suppress(redis.RedisError):
            ctx.records.keep_trace(
                record.turn_id, record.namespace, token, _carrier_of(trace.context)
            )
    return trace


def _content(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return redact(text)


def _messages(role: str, text: str) -> str:
    """GenAI's gen_ai.input.messages / gen_ai.output.messages: one message of one text part."""
    return _content([{"role": role, "parts": [{"type": "text", "content": text}]}])


class AttemptTrace:
    """The spans of one attempt: its own, and the children the turn's hooks report."""

    def __init__(self, tracer: Any, parent: Any, record: TurnRecord, settings: Any) -> None:
        self._tracer = tracer
        self._capture = bool(settings.otel_capture_content)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": record.agent,
            "gen_ai.conversation.id": record.conversation_id,
            "agentjobs.turn.id": record.turn_id,
            "agentjobs.attempt": record.attempt,
            "agentjobs.delivery": record.deliveries,
        }
        payload = record.payload if isinstance(record.payload, Mapping) else {}
        if self._capture and isinstance(payload.get("message"), str):
            attributes["gen_ai.input.messages"] = _messages("user", payload["message"])
        self._span = tracer.start_span(
            f"invoke_agent {record.agent}",
            context=parent,
            kind=otel_trace.SpanKind.INTERNAL,
            attributes=attributes,
        )
        self.context = otel_trace.set_span_in_context(self._span)
        self._lock = threading.Lock()
        self._chat: Any = None
        self._tools: dict[tuple[str, int], Any] = {}
        self._arguments: dict[str, Any] = {}  # tool call id -> its arguments, when captured

    @property
    def span(self) -> Any:
        return self._span

    @_never_raises
    def model_call(self, report: ModelCallReport) -> None:
        if report.phase is ModelCallPhase.STARTED:
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": report.provider,
                "gen_ai.request.model": report.model,
                "agentjobs.iteration": report.iteration,
            }
            span = self._child(f"chat {report.model}", otel_trace.SpanKind.CLIENT, attributes)
            with self._lock:
                self._chat = span
            return
        with self._lock:
            span, self._chat = self._chat, None
        if span is None:
            return
        usage = report.usage or {}
        for ours, theirs in (("inputTokens", "input"), ("outputTokens", "output")):
            if isinstance(usage.get(ours), int):
                span.set_attribute(f"gen_ai.usage.{theirs}_tokens", usage[ours])
        if not report.ok:
            _failed(span, report.error_type or "_OTHER")
        span.end()

    @_never_raises
    def response(self, report: ResponseReport) -> None:
        """A model response with tool calls: their arguments, when content is captured."""
        if not self._capture:
            return
        for call in report.message.get("toolCalls") or []:
            with self._lock:
                self._arguments[str(call.get("id"))] = call.get("args")

    @_never_raises
    def tool_call(self, report: ToolCallReport) -> None:
        key = (report.tool_call_id, report.index)
        if report.phase is ToolCallPhase.STARTED:
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": report.tool,
                "gen_ai.tool.call.id": report.tool_call_id,
                "gen_ai.tool.type": "function",
                "agentjobs.tool.attempt": report.attempt,
                "agentjobs.tool.effect": str(report.effect),
            }
            with self._lock:
                arguments = self._arguments.get(report.tool_call_id)
            if self._capture and arguments is not None:
                attributes["gen_ai.tool.call.arguments"] = _content(arguments)
            kind = otel_trace.SpanKind.INTERNAL
            span = self._child(f"execute_tool {report.tool}", kind, attributes)
            with self._lock:
                self._tools[key] = span
            return
        with self._lock:
            span = self._tools.pop(key, None)
        if span is None:
            return
        if self._capture and report.content is not None:
            span.set_attribute("gen_ai.tool.call.result", _content(report.content))
        if not report.ok:
            timed_out = (report.content or "").startswith("[timed out]")
            _failed(span, "timeout" if timed_out else "tool_error")
        span.end()

    @_never_raises
    def outcome(self, outcome: str, error: BaseException | None, reason: str, answer: str) -> None:
        """What the attempt came to (tasks/turn/outcomes.py, Outcome), on its span."""
        self._span.set_attribute("agentjobs.outcome", outcome)
        if reason:
            self._span.set_attribute("agentjobs.dead_letter.reason", reason)
        if error is not None:
            _failed(self._span, type(error).__name__)
        if self._capture and answer:
            self._span.set_attribute("gen_ai.output.messages", _messages("assistant", answer))

    def _child(self, name: str, kind: Any, attributes: Mapping[str, Any]) -> Any:
        return self._tracer.start_span(name, context=self.context, kind=kind, attributes=attributes)

    @_never_raises
    def end(self) -> None:
        """End the attempt's span, and any child its hooks did not finish (the attempt stopped
        in a model call or a tool)."""
        with self._lock:
            left = [self._chat, *self._tools.values()]
            self._chat, self._tools = None, {}
        for span in left:
            if span is not None:
                _failed(span, INTERRUPTED)
                span.end()
        self._span.end()


def _failed(span: Any, error_type: str) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error_type))
