"""Agent: the doors (run, follow_up, resume_on_error, checkpoint) and the iteration loop.

One run is one turn: seed the history, then model call -> tool calls -> next iteration until the
model answers. `max_iterations` is an action budget, as in the reference: when the model still
asks for tools on the last allowed call, those calls do not run, the assistant message carrying
them is not kept, the WRAP_UP_INSTRUCTION user message is appended (and kept), and one more
call goes out with no tools offered; its reply is the turn's answer and it counts as an
iteration (p01). Everything a run changes lives in a `_Run` local to that call; the instance
only holds the in-flight mark and the last run's committed state, so one Agent runs one turn at
a time (RunInFlightError) and separate instances share nothing mutable.

Durability hooks: `run`, `follow_up` and `resume_on_error` take `on_progress` (called with an
AgentRunCheckpoint) and `on_report` (called with a ProgressReport: that checkpoint and the
ProgressKind saying what moved). Both are called at the same points, one after the other
(`on_progress` first), and return before the loop goes on (persist, then proceed):
- `seeded`: the turn's history is seeded (after the input chain, before the first model call);
- `round`: an iteration ended and the loop goes on: its tool results are in, or, with no tool
  run, the budget's wrap-up message was appended or an evidence revision was asked for;
- `folded`: compaction folded old messages into a summary.
The checkpoint is the crash-checkpoint shape without failurePoint. If a hook raises, the run
stops with RunCheckpointError (that error as its cause, the last progress as its checkpoint).
`on_progress` is an adapter over `on_report`: one code path.

Tool calls: the same doors take `on_tool_call`, called with a ToolCallReport just before a
registered tool runs (`started`) and just after it returns or raises (`finished`, with `ok`
False when it raised or timed out). A call to an unknown tool runs nothing and reports nothing.
If the hook raises, the run stops with RunCheckpointError, as for the other hooks.

Model calls: the same doors take `on_model_call`, called with a ModelCallReport just before each
call of the provider's `complete` (`started`) and just after it returns (`finished`, `ok` True,
`usage` the response's integer counts when it has any) or raises (`finished`, `ok` False,
`error_type` the exception's class name; the exception then propagates as it would without the
hook). A host checks for cancellation at `started` and keeps telemetry from both. If the hook
raises at `started`, the model is not called; whenever it raises, the run stops with
RunCheckpointError, failure phase `llm`.

The journal (agent/journal.py): the same doors take `on_response`, called with a ResponseReport
when a model response whose tools will run arrives, before any of them runs, and `run` and
`resume_on_error` take `journal=`, the IterationJournal a host kept from that hook and the
tool-call reports, so an interrupted iteration continues without a second model call and
without running a completed call again. `parallel_tools=True` runs one response's calls at once
(the hooks are then called from their threads); the tool messages keep the model's order.

Tool timeouts: a tool's `timeout_s`, or else the agent's `tool_timeout_s`, limits each call of
it. A call past its limit is left running in its thread (Python cannot stop one) and its result
is dropped: the tool message says `[timed out] ...`, the `finished` report has `ok` False, the
identical-call note does not count it, and the loop goes on. A tool without a limit runs inline.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any, Literal

from agent.checkpoint import AgentRunCheckpoint, checkpoint_from_any
from agent.clock import RunTime, TimeLayer, clock_row, read_run_time
from agent.errors import (
    AgentError,
    ConversationMismatchError,
    InvalidRunInputError,
    MessageDeniedError,
    NoConversationError,
    RunCheckpointError,
    RunInFlightError,
    RunPausedError,
    ToolAbort,
    classify_failure_phase,
    resume_advice,
)
from agent.folding import Compaction
from agent.identity import normalize_identity
from agent.journal import (
    IterationJournal,
    JournaledCall,
    PendingRequest,
    ResponseReport,
    ToolEffect,
    new_idempotency_key,
    outcome_unknown_text,
)
from agent.jsnumbers import js_json, plain_json
from agent.messages import (
    LLMProvider,
    LLMRequest,
    LLMResponse,
    Message,
    assistant_message,
    is_unicode_text,
    request_messages,
    tool_message,
    unicode_text,
    user_message,
)
from agent.middleware import InputMiddleware, run_input_chain
from agent.pauses import Decision, RunPause, person_request, rejected_text
from agent.redact import redact_tool_error
from agent.repeated_calls import RepeatedCalls
from agent.skills import SkillGraph
from agent.timeouts import CallTimedOut, call_with_timeout, check_timeout_s
from agent.tools import Tool, ToolContext, tool_result_text, unknown_tool_text

DEFAULT_AGENT_ID = "agent"
DEFAULT_MAX_ITERATIONS = 10
MAX_MESSAGE_UTF16_UNITS = 1_000_000

# The user message a turn that ran out of its action budget gets, verbatim (p01).
WRAP_UP_INSTRUCTION = (
    "Your action budget for this turn is exhausted. Do not request tools. Give your best final "
    "answer from what you have: what you completed, what remains undone, and anything the "
    "person should know."
)

StopReason = Literal["answer", "max_iterations", "paused"]


class ProgressKind(StrEnum):
    """What moved the conversation when a progress report was made (see the module doc)."""

    SEEDED = "seeded"
    ROUND = "round"
    FOLDED = "folded"


@dataclass(frozen=True, slots=True)
class ProgressReport:
    kind: ProgressKind
    checkpoint: AgentRunCheckpoint


class ToolCallPhase(StrEnum):
    STARTED = "started"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class ToolCallReport:
    phase: ToolCallPhase
    tool: str
    tool_call_id: str
    ok: bool | None = None  # for `finished`: False when the tool raised or timed out
    index: int = 0  # the call's position in its response's toolCalls
    attempt: int = 1  # this start of the call (ToolContext.attempt)
    idempotency_key: str = ""  # ToolContext.idempotency_key
    effect: ToolEffect = ToolEffect.IDEMPOTENT
    content: str | None = None  # for `finished`: the tool message content (before any note)
    landed: bool | None = None  # for `finished`: whether the identical-call note counts it


class ModelCallPhase(StrEnum):
    STARTED = "started"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class ModelCallReport:
    phase: ModelCallPhase
    model: str
    iteration: int
    ok: bool | None = None  # for `finished`: False when the provider raised
    usage: Mapping[str, int] | None = None  # for `finished`: the response's counts, if any
    error_type: str | None = None  # for `finished` with ok False: the exception's class name
    provider: str = ""  # the provider's `name`


ProgressHook = Callable[[AgentRunCheckpoint], object]
ToolCallHook = Callable[[ToolCallReport], object]
ModelCallHook = Callable[[ModelCallReport], object]
ReportHook = Callable[[ProgressReport], object]
ResponseHook = Callable[[ResponseReport], object]
EvidenceCheck = Callable[[str, Sequence[Message]], "str | None"]

_run_seq = itertools.count(1)


def _now_ms() -> int:
    return int(time.time() * 1000)


def mint_run_id() -> str:
    return f"run-{_now_ms()}-{next(_run_seq)}"


@dataclass(frozen=True, slots=True)
class AgentInput:
    message: str
    continue_from: Any = None
    identity: Mapping[str, Any] | None = None
    message_from: str | None = None
    time: Any = None


@dataclass(frozen=True, slots=True)
class AgentResult:
    content: str
    run_id: str
    turn_number: int
    iterations: int
    # The conversation after this turn, as agent.checkpoint() returns it.
    checkpoint: AgentRunCheckpoint
    # "max_iterations": the budget ran out while the model still asked for tools; `content` is
    # then the wrap-up call's answer (or, for an agent without tools, that last reply's text).
    # "paused": a call waits for a person (agent/pauses.py); `content` is "", `pause` holds
    # what agent.resume needs, and `checkpoint` is the last completed iteration's.
    stop_reason: StopReason = "answer"
    usage: Mapping[str, int] = field(default_factory=dict)
    middleware_decisions: tuple[Mapping[str, Any], ...] = ()
    pause: RunPause | None = None


def normalize_input(value: object) -> AgentInput:
    """str | mapping | AgentInput -> AgentInput, or InvalidRunInputError naming the field."""
    if isinstance(value, str):
        value = AgentInput(message=value)
    elif isinstance(value, Mapping):
        value = AgentInput(
            message=value.get("message"),  # type: ignore[arg-type]
            continue_from=value.get("continueFrom", value.get("continue_from")),
            identity=value.get("identity"),
            message_from=value.get("messageFrom", value.get("message_from")),
            time=value.get("time"),
        )
    elif not isinstance(value, AgentInput):
        raise InvalidRunInputError("input", "must be a string, a mapping or an AgentInput")
    _check_message(value.message, "message")
    if value.message_from not in (None, "person", "composed"):
        raise InvalidRunInputError("messageFrom", "must be 'person' or 'composed'")
    return value


def _check_message(message: object, field_name: str) -> None:
    if not isinstance(message, str):
        raise InvalidRunInputError(field_name, "must be a string")
    if not message.strip():
        raise InvalidRunInputError(field_name, "must not be empty or whitespace only")
    if not is_unicode_text(message):
        raise InvalidRunInputError(
            field_name, "contains a lone UTF-16 surrogate; it is not Unicode text"
        )
    if len(message) > MAX_MESSAGE_UTF16_UNITS // 2 and (
        len(message.encode("utf-16-le", "surrogatepass")) // 2 > MAX_MESSAGE_UTF16_UNITS
    ):
        raise InvalidRunInputError(
            field_name, f"is longer than {MAX_MESSAGE_UTF16_UNITS} UTF-16 code units"
        )


@dataclass
class _Run:
    """Everything one run changes. Local to the call that runs it."""

    run_id: str
    raw_message: str
    history: list[Message]
    identity: dict[str, Any] | None
    turn: int
    folded: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    claim_verification: dict[str, Any] | None
    extra: Mapping[str, Any]
    skill_cursor: str | None
    revision_spent: bool
    pending_instruction: str | None
    clock: dict[str, Any] | None
    message: str = ""
    iteration: int = 0
    last_completed: int = 0
    progress: list[Message] = field(default_factory=list)
    bracket: tuple[str, str] | None = None
    answer: str | None = None
    finished: bool = False
    usage: dict[str, int] = field(default_factory=dict)
    decisions: tuple[Mapping[str, Any], ...] = ()
    # Identical-call landings of this run: the count restarts with every run (p02).
    repeats: RepeatedCalls = field(default_factory=RepeatedCalls)
    on_tool_call: ToolCallHook | None = None
    on_model_call: ModelCallHook | None = None
    on_response: ResponseHook | None = None
    # The iteration in flight as the host kept it; used (and dropped) at the first model call
    # whose history it fits.
    journal: IterationJournal | None = None
    # A person's decisions on the requests of a paused run, by request id.
    person_decisions: Mapping[str, Decision] = field(default_factory=dict)

    def hook(
        self,
        on_tool_call: ToolCallHook | None,
        on_model_call: ModelCallHook | None,
        on_response: ResponseHook | None,
        journal: IterationJournal | None,
    ) -> None:
        self.on_tool_call, self.on_model_call = on_tool_call, on_model_call
        self.on_response, self.journal = on_response, journal


class Agent:
    """An LLM agent whose conversations are AgentRunCheckpoint v1 values.

    Layers (all optional): `input_middleware` (the 'input' chain), `time` (a TimeLayer: accept a
    `time` input), `honesty` ({'inputs': True, ...}: write turnNumber), `skills` (a SkillGraph),
    `compaction` (fold old messages into summaries), `evidence_check` (one bounded revision of
    the answer per turn). `tool_timeout_s` is the time limit of every tool call whose tool has
    no `timeout_s` of its own (None: no limit). With `parallel_tools` the calls of one model
    response run at the same time; their tool messages keep the model's order. The text of a
    tool's exception is redacted (agent/redact.py; the provider's `redact`, when it has one)
    before anything holds it; `redact_tool_errors` (text -> text) adds a host's own rules, run
    first (the job system's: the values of its secret environment variables).
    """

    def __init__(
        self,
        *,
        provider: LLMProvider,
        model: str,
        system: str = "",
        tools: Sequence[Tool] = (),
        id: str | None = None,
        max_iterations: int = DEFAULT_MAX_ITERATIONS,
        input_middleware: Sequence[InputMiddleware] = (),
        time: TimeLayer | None = None,
        honesty: Mapping[str, bool] | None = None,
        skills: SkillGraph | None = None,
        compaction: Compaction | None = None,
        evidence_check: EvidenceCheck | None = None,
        tool_timeout_s: float | None = None,
        parallel_tools: bool = False,
        redact_tool_errors: Callable[[str], str] | None = None,
    ) -> None:
        if not callable(getattr(provider, "complete", None)):
            raise TypeError("Agent(provider=...) needs an object with complete(request)")
        if not isinstance(model, str):
            raise TypeError("Agent(model=...) must be a string")
        if id is not None and (not isinstance(id, str) or not id):
            raise TypeError("Agent(id=...) must be a non-empty string")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"Agent(tools=...) has duplicate tool names: {names}")
        self.provider = provider
        self.model = model
        self.system = system
        self.tools: tuple[Tool, ...] = tuple(tools)
        self._tools_by_name = {t.name: t for t in self.tools}
        # Schemas are user data written into every request: numbers as the reference writes them.
        self._tool_specs: list[dict[str, Any]] = [js_json(t.spec()) for t in self.tools]
        self.id = id if id is not None else DEFAULT_AGENT_ID
        self.named = id is not None
        ok = isinstance(max_iterations, int) and not isinstance(max_iterations, bool)
        self.max_iterations = max_iterations if ok and max_iterations >= 1 else 1
        self.input_middleware = tuple(input_middleware)
        self.time_layer = time
        self.honesty_armed = bool(honesty) and any(bool(v) for v in (honesty or {}).values())
        self.skills = skills
        self.compaction = compaction
        self.evidence_check = evidence_check
        self.tool_timeout_s = check_timeout_s(tool_timeout_s, "Agent(tool_timeout_s=...)")
        if not isinstance(parallel_tools, bool):
            raise TypeError("Agent(parallel_tools=...) must be True or False")
        self.parallel_tools = parallel_tools
        if redact_tool_errors is not None and not callable(redact_tool_errors):
            raise TypeError("Agent(redact_tool_errors=...) must be a function of text to text")
        self.redact_tool_errors = redact_tool_errors
        self._lock = threading.Lock()
        self._active_run_id: str | None = None
        self._ever_ran = False
        self._last: _Run | None = None
        self._paused: RunPause | None = None

    # -- doors ------------------------------------------------------------------------------

    def run(
        self,
        input: str | Mapping[str, Any] | AgentInput,
        *,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
        journal: IterationJournal | None = None,
    ) -> AgentResult:
        """One turn. With `continue_from` it continues that conversation with a new user turn."""
        request = normalize_input(input)
        run_id = self._claim("run")
        try:
            stored = None
            if request.continue_from is not None:
                stored = checkpoint_from_any(request.continue_from)
                self._check_agent_id("run", stored)
            caller = normalize_identity(request.identity, "identity")
            if caller is None:
                caller = normalize_identity(identity, "options.identity")
            if caller is None and stored is not None:
                caller = stored.identity
            run_time = self._read_time(request.time if request.time is not None else time)
            if stored is None:
                turn, history = 1, []
            elif stored.turn_number is not None:
                turn, history = int(stored.turn_number) + 1, list(stored.history)
            else:
                history = list(stored.history)
                turn = max(1, _count_users(history) + 1)
            state = self._new_run(run_id, request.message, history, caller, turn, stored, run_time)
            state.clock = self._clock_for(state, stored, run_time, resuming=False)
            state.hook(on_tool_call, on_model_call, on_response, journal)
            reporter = _reporter(on_progress, on_report)
            return self._execute(state, append_user=True, reporter=reporter)
        finally:
            self._release()

    def follow_up(
        self,
        message: str,
        *,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
    ) -> AgentResult:
        """Continue this instance's last finished conversation with `message`."""
        with self._lock:
            ever_ran, last = self._ever_ran, self._last
        if not ever_ran:
            raise NoConversationError("never-run")
        if last is None or not last.finished or not last.history:
            raise NoConversationError("last-run-unfinished")
        conversation = self._committed_checkpoint(last)
        return self.run(
            AgentInput(message=message, continue_from=conversation),
            identity=identity,
            time=time,
            on_progress=on_progress,
            on_report=on_report,
            on_tool_call=on_tool_call,
            on_model_call=on_model_call,
            on_response=on_response,
        )

    def resume_on_error(
        self,
        checkpoint: AgentRunCheckpoint | Mapping[str, Any] | bytes | str,
        *,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
        journal: IterationJournal | None = None,
    ) -> AgentResult:
        """Re-run the failed turn of `checkpoint`: same history, same turn, nothing appended.
        With `journal`, the iteration in flight continues from it (agent/journal.py)."""
        hooks = (on_progress, on_report, on_tool_call, on_model_call, on_response)
        return self._resume("resume_on_error", checkpoint, identity, time, hooks, journal, {})

    def resume(
        self,
        decisions: Mapping[str, Decision],
        *,
        pause: RunPause | None = None,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
    ) -> AgentResult:
        """Answer a paused run (agent/pauses.py): `decisions` by request id, for this
        instance's pause or, from any process, for `pause`. Requests left undecided pause the
        run again."""
        with self._lock:
            held = self._paused
        pause = pause if pause is not None else held
        if pause is None:
            raise InvalidRunInputError("pause", "there is no paused run to resume")
        for request_id, decision in decisions.items():
            request = pause.request(request_id)
            if request is None:
                raise InvalidRunInputError(
                    f"decisions[{request_id!r}]", "names no pending request of this pause"
                )
            if not isinstance(decision, Decision) or not decision.fits(request):
                raise InvalidRunInputError(
                    f"decisions[{request_id!r}]",
                    f"a {request.kind} takes Decision.approve or .reject"
                    if request.kind == "approval"
                    else "a question takes Decision.answer or .reject",
                )
        if held is pause:
            with self._lock:
                self._paused = None
        hooks = (on_progress, on_report, on_tool_call, on_model_call, on_response)
        try:
            return self._resume(
                "resume", pause.checkpoint, identity, time, hooks, pause.journal, decisions
            )
        except BaseException:
            if held is pause:
                with self._lock:
                    self._paused = self._paused or held
            raise

    def abandon_pause(self) -> bool:
        """Drop this instance's paused run (nothing of its paused iteration is kept); True when
        there was one."""
        with self._lock:
            held, self._paused = self._paused, None
        return held is not None

    @property
    def paused(self) -> RunPause | None:
        """This instance's paused run, if its last run paused."""
        with self._lock:
            return self._paused

    def _resume(
        self,
        door: str,
        checkpoint: AgentRunCheckpoint | Mapping[str, Any] | bytes | str,
        identity: Mapping[str, Any] | None,
        time: Any,
        hooks: tuple[Any, Any, Any, Any, Any],
        journal: IterationJournal | None,
        decisions: Mapping[str, Decision],
    ) -> AgentResult:
        on_progress, on_report, on_tool_call, on_model_call, on_response = hooks
        run_id = self._claim(door)
        try:
            stored = checkpoint_from_any(checkpoint)
            self._check_agent_id(door, stored)
            caller = normalize_identity(identity, "options.identity") or stored.identity
            run_time = self._read_time(time)
            history = list(stored.history)
            if stored.turn_number is not None:
                turn = int(stored.turn_number)
            else:
                turn = max(1, _count_users(history))
            message = stored.original_input["message"]
            state = self._new_run(run_id, message, history, caller, turn, stored, run_time)
            recovery = stored.evidence_recovery
            if recovery is not None:
                state.revision_spent = True
                pending = recovery.get("pending")
                state.pending_instruction = pending["instruction"] if pending else None
            state.clock = self._clock_for(state, stored, run_time, resuming=True)
            state.hook(on_tool_call, on_model_call, on_response, journal)
            state.person_decisions = decisions
            reporter = _reporter(on_progress, on_report)
            return self._execute(state, append_user=False, reporter=reporter)
        finally:
            self._release()

    def checkpoint(self) -> AgentRunCheckpoint | None:
        """The conversation after the last run (None before any run). Only meaningful between
        runs; after a failed run it holds that run's committed history and no answer."""
        with self._lock:
            last = self._last
        return None if last is None else self._committed_checkpoint(last)

    # -- in-flight mark ---------------------------------------------------------------------

    def _claim(self, door: str) -> str:
        with self._lock:
            if self._active_run_id is not None:
                raise RunInFlightError(door, self.id, self._active_run_id)
            if self._paused is not None and door != "resume":
                raise RunPausedError(door, len(self._paused.pending))
            run_id = mint_run_id()
            self._active_run_id = run_id
            return run_id

    def _release(self) -> None:
        with self._lock:
            self._active_run_id = None

    def _commit(self, state: _Run) -> None:
        with self._lock:
            self._ever_ran = True
            self._last = state

    # -- seeding ----------------------------------------------------------------------------

    def _check_agent_id(self, door: str, stored: AgentRunCheckpoint) -> None:
        stored_id = (stored.agent or {}).get("id")
        if stored_id is not None and self.named and stored_id != self.id:
            raise ConversationMismatchError(door, stored_id, self.id)

    def _read_time(self, value: Any) -> RunTime | None:
        if value is None:
            return None
        if self.time_layer is None:
            raise InvalidRunInputError(
                "time", "this agent has no time layer; build it with Agent(time=TimeLayer(...))"
            )
        return read_run_time(value)

    def _new_run(
        self,
        run_id: str,
        raw_message: str,
        history: list[Message],
        identity: dict[str, Any] | None,
        turn: int,
        stored: AgentRunCheckpoint | None,
        run_time: RunTime | None,
    ) -> _Run:
        cursor = None
        if stored is not None and self.skills is not None:
            cursor = self.skills.restore(stored.skill_cursor)
        return _Run(
            run_id=run_id,
            raw_message=raw_message,
            history=history,
            identity=identity,
            turn=turn,
            folded=list(stored.folded or ()) if stored else [],
            ledger=list(stored.findings_ledger or ()) if stored else [],
            claim_verification=stored.claim_verification if stored else None,
            extra=stored.extra if stored else {},
            skill_cursor=cursor,
            revision_spent=False,
            pending_instruction=None,
            clock=None,
        )

    def _clock_for(
        self,
        state: _Run,
        stored: AgentRunCheckpoint | None,
        run_time: RunTime | None,
        *,
        resuming: bool,
    ) -> dict[str, Any] | None:
        if self.time_layer is None:
            return None
        if resuming:
            # The failed turn already fixed its clock: keep it, and record a different one passed.
            kept: dict[str, Any] | None = next(
                (
                    row
                    for row in reversed(state.ledger)
                    if row.get("kind") == "clock" and row.get("turn") == state.turn
                ),
                None,
            )
            if kept is not None:
                passed = {
                    key: value
                    for key, value in (
                        ("now", run_time and run_time.now),
                        ("zone", run_time and run_time.zone),
                    )
                    if value is not None
                }
                if any(kept.get(key) != value for key, value in passed.items()):
                    state.ledger.append(
                        {
                            "kind": "clock-on-resume",
                            "turn": state.turn,
                            "passed": passed,
                            "kept": {"now": kept.get("now"), "zone": kept.get("zone")},
                        }
                    )
                return kept
        row = clock_row(self.time_layer, run_time, state.turn)
        state.ledger.append(row)
        return row

    # -- the loop ---------------------------------------------------------------------------

    def _execute(
        self, state: _Run, *, append_user: bool, reporter: ReportHook | None
    ) -> AgentResult:
        try:
            message, decisions = run_input_chain(
                self.input_middleware, state.raw_message, state.identity
            )
        except MessageDeniedError as denied:
            state.message = denied.denied_message
            if append_user or not state.history:
                state.history = [*state.history, user_message(denied.denied_message)]
            state.progress = list(state.history)
            self._commit(state)
            raise
        state.message, state.decisions = message, decisions
        if append_user or not state.history:
            state.history = [*state.history, user_message(message)]
        if self.skills is not None:
            state.skill_cursor = self.skills.route(message, state.skill_cursor)
        state.progress = list(state.history)
        try:
            self._report(state, ProgressKind.SEEDED, reporter)
            content, stop = self._loop(state, reporter)
        except _Paused as paused:
            return self._paused_result(state, paused.pause)
        except Exception as exc:
            self._commit(state)
            if isinstance(exc, MessageDeniedError):
                raise
            raise self._crash(state, exc) from exc
        state.answer, state.finished = unicode_text(content), True
        self._commit(state)
        return AgentResult(
            content=state.answer,
            run_id=state.run_id,
            turn_number=state.turn,
            iterations=state.iteration,
            checkpoint=self._committed_checkpoint(state),
            stop_reason=stop,
            usage=dict(state.usage),
            middleware_decisions=state.decisions,
        )

    def _paused_result(self, state: _Run, pause: RunPause) -> AgentResult:
        self._commit(state)
        with self._lock:
            self._paused = pause
        return AgentResult(
            content="",
            run_id=state.run_id,
            turn_number=state.turn,
            iterations=state.iteration,
            checkpoint=pause.checkpoint,
            stop_reason="paused",
            usage=dict(state.usage),
            middleware_decisions=state.decisions,
            pause=pause,
        )

    def _loop(self, state: _Run, reporter: ReportHook | None) -> tuple[str, StopReason]:
        wrapping_up = False
        while True:
            state.iteration += 1
            self._maybe_fold(state, reporter)
            journal = None if wrapping_up else self._take_journal(state)
            if journal is not None:
                # The iteration in flight when the run was interrupted: its response was kept,
                # so the model is not asked again; its tools continue from the journal.
                self._run_tools(state, js_json(journal.message), journal)
            else:
                response = self._call_model(state, offer_tools=not wrapping_up)
                if wrapping_up:
                    # The wrap-up reply is the answer; tool calls it carries anyway do not run.
                    return response.content, "max_iterations"
                if not response.tool_calls:
                    if self._needs_revision(state, response.content):
                        self._report(state, ProgressKind.ROUND, reporter)
                        continue
                    return response.content, "answer"
                if state.iteration < self.max_iterations:
                    message = assistant_message(response)
                    if state.on_response is not None:
                        report = ResponseReport(state.iteration, len(state.history), message)
                        state.on_response(report)
                    self._run_tools(state, message, None)
                elif self._tool_specs:
                    self._ask_for_wrap_up(state)
                    wrapping_up = True
                else:
                    # No tools to withhold, so no wrap-up (the reference mounts it only on an
                    # agent that can call tools): the turn is cut short with this reply's text.
                    return response.content, "max_iterations"
            state.last_completed = state.iteration
            state.progress = list(state.history)
            self._report(state, ProgressKind.ROUND, reporter)

    def _take_journal(self, state: _Run) -> IterationJournal | None:
        """The host's journal, once, if it is of this point of the history."""
        journal, state.journal = state.journal, None
        if journal is None or journal.history_length != len(state.history):
            return None
        return journal

    def _call_model(self, state: _Run, *, offer_tools: bool) -> LLMResponse:
        state.bracket = ("llm", "call-llm")
        request = self._request(state, offer_tools=offer_tools)
        hook = state.on_model_call
        if hook is not None:
            hook(self._model_report(state, ModelCallPhase.STARTED))
        try:
            response = self.provider.complete(request)
            if not isinstance(response, LLMResponse):
                raise TypeError(
                    f"provider {self._provider_name()} returned "
                    f"{type(response).__name__}, not an LLMResponse"
                )
        except Exception as exc:
            if hook is not None:
                hook(self._model_report(state, ModelCallPhase.FINISHED, error=exc))
            raise
        if hook is not None:
            usage = None if response.usage is None else _int_usage(response.usage)
            hook(self._model_report(state, ModelCallPhase.FINISHED, usage=usage))
        state.bracket = None
        _add_usage(state.usage, response.usage)
        if state.pending_instruction is not None:
            state.pending_instruction = None  # the request that carried it completed
        return response

    def _provider_name(self) -> str:
        return str(getattr(self.provider, "name", None) or type(self.provider).__name__)

    def _model_report(
        self,
        state: _Run,
        phase: ModelCallPhase,
        *,
        usage: Mapping[str, int] | None = None,
        error: Exception | None = None,
    ) -> ModelCallReport:
        ok = None if phase is ModelCallPhase.STARTED else error is None
        return ModelCallReport(
            phase=phase,
            model=self.model,
            iteration=state.iteration,
            ok=ok,
            usage=usage,
            error_type=None if error is None else type(error).__name__,
            provider=self._provider_name(),
        )

    def _ask_for_wrap_up(self, state: _Run) -> None:
        """The budget is spent and the model still wants tools: the calls do not run and the
        message carrying them is not kept (its text would be a fragment); the ask is kept."""
        state.history = [*state.history, user_message(WRAP_UP_INSTRUCTION)]

    def _run_tools(self, state: _Run, message: Message, journal: IterationJournal | None) -> None:
        calls: list[dict[str, Any]] = message["toolCalls"]
        journaled = dict(journal.calls) if journal is not None else {}
        requests = self._person_requests(state, calls, journal)
        outcomes: dict[int, tuple[str, bool]] = {}
        runnable: list[tuple[int, dict[str, Any]]] = []
        for index, call in enumerate(calls):
            request = requests.get(index)
            decision = state.person_decisions.get(request.request_id) if request else None
            if request is None or (decision is not None and decision.kind == "approve"):
                if decision is not None and decision.edited_args is not None:
                    call = {**call, "args": js_json(dict(decision.edited_args))}
                runnable.append((index, call))
            elif decision is not None:
                text = (
                    rejected_text(decision.message) if decision.kind == "reject" else decision.text
                )
                outcomes[index] = (unicode_text(text), decision.kind == "answer")
        if self.parallel_tools and len(runnable) > 1:
            state.bracket = ("tool", runnable[0][1]["name"] or "tool")
            outcomes.update(self._calls_in_parallel(state, runnable, journaled))
        else:
            for index, call in runnable:
                state.bracket = ("tool", call["name"] or "tool")
                outcomes[index] = self._call_tool(state, index, call, journaled.get(index))
        state.bracket = None
        waiting = [r for r in requests.values() if r.request_id not in state.person_decisions]
        if waiting:
            raise _Paused(self._pause(state, message, outcomes, journaled, requests, waiting))
        history = [*state.history, message]
        ordered = [outcomes[index] for index in range(len(calls))]
        for call, (content, landed) in zip(calls, ordered, strict=True):
            name, args = call["name"], call["args"]
            if landed:
                # In the model's order whatever order the calls ran in, so the note is the
                # same either way.
                content += state.repeats.note_for(name, args, content)
            history.append(tool_message(call["id"], name, content))
        state.history = history

    def _calls_in_parallel(
        self,
        state: _Run,
        calls: Sequence[tuple[int, Mapping[str, Any]]],
        journaled: Mapping[int, JournaledCall],
    ) -> dict[int, tuple[str, bool]]:
        """Every call at once, each in its own thread (in a copy of the caller's context). All
        of them end before the first failure, in the model's order, is raised: a call that
        completed has reported its outcome, so a host keeps it."""
        with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="agent-tools") as pool:
            futures = {
                index: pool.submit(
                    contextvars.copy_context().run,
                    self._call_tool,
                    state,
                    index,
                    call,
                    journaled.get(index),
                )
                for index, call in calls
            }
            wait(futures.values())
        return {index: future.result() for index, future in futures.items()}

    def _person_requests(
        self, state: _Run, calls: Sequence[Mapping[str, Any]], journal: IterationJournal | None
    ) -> dict[int, PendingRequest]:
        """The calls that wait for a person: those the journal recorded as such, and any other
        not yet completed whose tool asks for one (an approval check runs once per call)."""
        known = dict(journal.requests) if journal is not None else {}
        journaled = journal.calls if journal is not None else {}
        requests: dict[int, PendingRequest] = {}
        for index, call in enumerate(calls):
            if index in known:
                requests[index] = known[index]
                continue
            done = journaled.get(index)
            found = self._tools_by_name.get(call["name"])
            if found is None or (done is not None and (done.completed or done.attempts > 0)):
                continue
            request = person_request(found, index, call, self._tool_context(state, call, "", 1))
            if request is not None:
                requests[index] = request
        return requests

    def _pause(
        self,
        state: _Run,
        message: Message,
        outcomes: Mapping[int, tuple[str, bool]],
        journaled: Mapping[int, JournaledCall],
        requests: Mapping[int, PendingRequest],
        waiting: Sequence[PendingRequest],
    ) -> RunPause:
        """The run as a person finds it: the other calls have run and are in the journal."""
        calls = dict(journaled)
        for index, (content, landed) in outcomes.items():
            old = calls.get(index)
            call_id = message["toolCalls"][index]["id"]
            calls[index] = JournaledCall(
                call_id,
                old.idempotency_key if old else "",
                old.attempts if old else 1,
                content=content,
                landed=landed,
            )
        undecided = {r.index: r for r in waiting}
        journal = IterationJournal(len(state.history), message, calls, undecided)
        checkpoint = self._progress_checkpoint(state, failure=None)
        return RunPause(checkpoint, journal, tuple(waiting))

    def _call_tool(
        self,
        state: _Run,
        index: int,
        call: Mapping[str, Any],
        journaled: JournaledCall | None,
    ) -> tuple[str, bool]:
        """The tool result text, and whether it landed: a result of the tool, which the
        identical-call note counts (a call to an unknown tool or a timed-out call is not)."""
        name, call_id = call["name"], call["id"]
        found = self._tools_by_name.get(name)
        if found is None:
            return unknown_tool_text(name), False
        effect = ToolEffect(found.effect)
        if journaled is not None and journaled.completed:
            assert journaled.content is not None
            return journaled.content, journaled.landed
        if journaled is not None and journaled.attempts > 0 and effect is ToolEffect.UNSAFE:
            # It started and may have taken effect: never run it twice; the model is told.
            return outcome_unknown_text(name), False
        started = journaled is not None and journaled.attempts > 0
        key = journaled.idempotency_key if started and journaled else new_idempotency_key()
        attempt = journaled.attempts + 1 if started and journaled else 1
        ctx = self._tool_context(state, call, key, attempt)
        report = partial(
            ToolCallReport,
            tool=name,
            tool_call_id=call_id,
            index=index,
            attempt=attempt,
            idempotency_key=key,
            effect=effect,
        )
        hook = state.on_tool_call
        if hook is not None:
            hook(report(ToolCallPhase.STARTED))
        limit = found.timeout_s if found.timeout_s is not None else self.tool_timeout_s
        run = partial(found.call, plain_json(call["args"]), ctx)
        landed = True
        try:
            value = run() if limit is None else call_with_timeout(run, limit, name=name)
            text, ok = tool_result_text(value), True
        except ToolAbort:
            raise
        except CallTimedOut as timed_out:
            # Left running in its thread; the model decides what to do without its result.
            text, ok, landed = str(timed_out), False, False
        except Exception as exc:
            # Reported to the model, which decides what to do next (fixture c1); an empty
            # message is an empty result, as the reference writes it.
            text, ok = unicode_text(self._redact_tool_error(exc)), False
        if hook is not None:
            hook(report(ToolCallPhase.FINISHED, ok=ok, content=text, landed=landed))
        return text, landed

    def _redact_tool_error(self, exc: Exception) -> str:
        """A tool's exception text without secrets, before the history, a hook or the model
        holds it: the host's rules (`redact_tool_errors`) first, then the provider's own (its
        `redact`, when it has one: its key and endpoint), then agent/redact.py's."""
        provider_redact = getattr(self.provider, "redact", None)
        try:
            text = str(exc)
            if self.redact_tool_errors is not None:
                text = self.redact_tool_errors(text)
            if callable(provider_redact):
                text = provider_redact(text)
        except Exception:
            # Text that could not be redacted is not passed on, whatever failed.
            return f"{type(exc).__name__} (its message is withheld: it could not be redacted)"
        return redact_tool_error(text)

    def _tool_context(
        self, state: _Run, call: Mapping[str, Any], key: str, attempt: int
    ) -> ToolContext:
        return ToolContext(
            run_id=state.run_id,
            tool_call_id=call["id"],
            turn_number=state.turn,
            identity=state.identity,
            clock=state.clock,
            idempotency_key=key,
            attempt=attempt,
        )

    def _needs_revision(self, state: _Run, answer: str) -> bool:
        if self.evidence_check is None or state.revision_spent:
            return False
        instruction = self.evidence_check(answer, list(state.history))
        if not instruction:
            return False
        state.revision_spent = True
        state.pending_instruction = instruction
        return True

    def _maybe_fold(self, state: _Run, reporter: ReportHook | None) -> None:
        if self.compaction is None:
            return
        folded = self.compaction.fold(
            state.history,
            run_id=state.run_id,
            iteration=state.iteration,
            model=self.model,
            fold_number=len(state.folded) + 1,
        )
        if folded is None:
            return
        state.history, span = folded
        state.folded = [*state.folded, span]
        state.progress = list(state.history)
        self._report(state, ProgressKind.FOLDED, reporter)

    def _request(self, state: _Run, *, offer_tools: bool) -> LLMRequest:
        pieces = [self.system] if self.system else []
        if self.skills is not None and state.skill_cursor is not None:
            pieces.append(self.skills.instruction(state.skill_cursor))
        if state.clock is not None:
            pieces.append(f"Current time: {state.clock['now']} (time zone {state.clock['zone']}).")
        if state.pending_instruction is not None:
            pieces.append(state.pending_instruction)
        return LLMRequest(
            system_prompt="\n\n".join(pieces),
            messages=request_messages(state.history),
            tools=self._tool_specs if offer_tools else [],
            model=self.model,
            run_id=state.run_id,
            iteration=state.iteration,
        )

    # -- writers ----------------------------------------------------------------------------

    def _report(self, state: _Run, kind: ProgressKind, reporter: ReportHook | None) -> None:
        """Persist-then-proceed: the hooks return before the loop goes on."""
        if reporter is not None:
            reporter(ProgressReport(kind, self._progress_checkpoint(state, failure=None)))

    def _common(self, state: _Run) -> dict[str, Any]:
        recovery: dict[str, Any] | None = None
        if state.revision_spent:
            recovery = {"revisionSpent": True}
            if state.pending_instruction is not None:
                recovery["pending"] = {"instruction": state.pending_instruction}
        cursor = state.skill_cursor
        keep_cursor = self.skills is not None and self.skills.continuity == "conversation"
        return {
            "folded": list(state.folded) or None,
            "findings_ledger": list(state.ledger) or None,
            "claim_verification": state.claim_verification,
            "turn_number": state.turn if self.honesty_armed else None,
            "evidence_recovery": recovery,
            "identity": state.identity,
            "skill_cursor": cursor if keep_cursor and cursor else None,
            "agent": {"id": self.id} if self.named else None,
            "extra": state.extra,
        }

    def _progress_checkpoint(
        self, state: _Run, failure: dict[str, Any] | None
    ) -> AgentRunCheckpoint:
        """The crash-checkpoint shape: history as of the last completed tool round."""
        return AgentRunCheckpoint(
            run_id=state.run_id,
            history=list(state.progress),
            last_completed_iteration=state.last_completed,
            original_input={"message": state.raw_message},
            checkpointed_at=_now_ms(),
            failure_point=failure,
            **self._common(state),
        )

    def _committed_checkpoint(self, state: _Run) -> AgentRunCheckpoint:
        history = list(state.progress if not state.finished else state.history)
        if state.finished and state.answer:
            history.append({"role": "assistant", "content": state.answer})
        return AgentRunCheckpoint(
            run_id=state.run_id,
            history=history,
            last_completed_iteration=state.iteration,
            original_input={"message": state.message},
            checkpointed_at=_now_ms(),
            **self._common(state),
        )

    def _crash(self, state: _Run, exc: Exception) -> RunCheckpointError:
        iteration = state.iteration or state.last_completed + 1
        failure: dict[str, Any] = {"iteration": iteration}
        if state.bracket is not None:
            failure["phase"], failure["stage"] = state.bracket
        else:
            failure["phase"] = classify_failure_phase(exc)
        checkpoint = self._progress_checkpoint(state, failure)
        where = {
            "llm": "during the LLM call",
            "tool": "during a tool call",
            "iteration": "between iterations",
        }.get(failure["phase"], "at an unidentified point")
        stage = f" (stage: {failure['stage']})" if "stage" in failure else ""
        message = (
            f"[agent run] failed at iteration {iteration} {where}{stage}. Last-good checkpoint "
            f"captured at iteration {state.last_completed}. {resume_advice(exc)} "
            f"Underlying error: {exc}"
        )
        return RunCheckpointError(message, checkpoint=checkpoint, cause=exc)


class _Paused(Exception):
    """Control flow, not a failure: the iteration waits for a person."""

    def __init__(self, pause: RunPause) -> None:
        super().__init__("paused")
        self.pause = pause


def _reporter(on_progress: ProgressHook | None, on_report: ReportHook | None) -> ReportHook | None:
    """One hook for the loop: on_progress is an adapter that passes on the checkpoint alone."""
    if on_progress is None:
        return on_report

    def report(progress: ProgressReport) -> None:
        on_progress(progress.checkpoint)
        if on_report is not None:
            on_report(progress)

    return report


def _count_users(history: Sequence[Message]) -> int:
    return sum(1 for m in history if m.get("role") == "user")


def _int_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """A provider's usage counts: its integer entries (a provider may add other details)."""
    return {
        key: value
        for key, value in usage.items()
        if isinstance(value, int) and not isinstance(value, bool)
    }


def _add_usage(total: dict[str, int], usage: Mapping[str, Any] | None) -> None:
    for key, value in _int_usage(usage or {}).items():
        total[key] = total.get(key, 0) + value


__all__ = [
    "WRAP_UP_INSTRUCTION",
    "Agent",
    "AgentError",
    "AgentInput",
    "AgentResult",
    "ProgressKind",
    "ProgressReport",
    "normalize_input",
]
