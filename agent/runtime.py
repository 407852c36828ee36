"""Agent: its configuration, the doors (run, follow_up, resume_on_error, resume, checkpoint), the
in-flight mark and the commit of each run's state.

A door checks its input, claims the instance (one Agent runs one turn at a time:
RunInFlightError; a paused instance refuses every door but `resume`: RunPausedError), seeds a
RunState from the input or the checkpoint it continues (turn number, identity, the turn's clock,
the skill cursor, the stored ledger), and hands it to a Loop (agent/loop.py), which runs the
iterations. Everything a run changes lives in that RunState; the instance only holds the
in-flight mark, the last run's committed state (what `checkpoint()` and `follow_up` read) and a
paused run, so separate instances share nothing mutable.

Hooks: every door takes `hooks=`, one RunHooks object whose check points a host overrides and
which stop the run by returning a value (RunStopped), or the five keyword hooks `on_progress`,
`on_report`, `on_tool_call`, `on_model_call` and `on_response`, which become one RunHooks
(agent/hooks.py tells when each point is called and what a stop there does). Not both: the door
raises TypeError. A hook that raises stops the run with RunCheckpointError, that exception its
cause and the last progress its checkpoint.

Tokens: every door also takes `on_token`, called with a TokenDelta for each piece of answer text
as the model writes it; with it the run streams its model calls where the provider can
(agent/loop.py), and without it nothing changes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.checkpoint import AgentRunCheckpoint, checkpoint_from_any
from agent.clock import RunTime, TimeLayer, clock_row, read_run_time
from agent.errors import (
    AgentError,
    ConversationMismatchError,
    InvalidRunInputError,
    NoConversationError,
    RunInFlightError,
    RunPausedError,
)
from agent.folding import Compaction
from agent.hooks import (
    ModelCallHook,
    ModelCallPhase,
    ModelCallReport,
    ProgressHook,
    ProgressKind,
    ProgressReport,
    ReportHook,
    ResponseHook,
    RunHooks,
    TokenHook,
    ToolCallHook,
    ToolCallPhase,
    ToolCallReport,
    door_hooks,
)
from agent.identity import normalize_identity
from agent.journal import IterationJournal
from agent.jsnumbers import js_json
from agent.loop import (
    WRAP_UP_INSTRUCTION,
    EvidenceCheck,
    Loop,
    RunState,
    StopReason,
    now_ms,
)
from agent.messages import LLMProvider, Message, is_unicode_text
from agent.middleware import InputMiddleware
from agent.pauses import Decision, RunPause
from agent.skills import SkillGraph
from agent.timeouts import check_timeout_s
from agent.tools import Tool

DEFAULT_AGENT_ID = "agent"
DEFAULT_MAX_ITERATIONS = 10
MAX_MESSAGE_UTF16_UNITS = 1_000_000

_run_seq = itertools.count(1)


def mint_run_id() -> str:
    return f"run-{now_ms()}-{next(_run_seq)}"


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
        self._last: RunState | None = None
        self._paused: RunPause | None = None

    # -- doors ------------------------------------------------------------------------------

    def run(
        self,
        input: str | Mapping[str, Any] | AgentInput,
        *,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        hooks: RunHooks | None = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
        journal: IterationJournal | None = None,
        on_token: TokenHook | None = None,
    ) -> AgentResult:
        """One turn. With `continue_from` it continues that conversation with a new user turn."""
        _check_on_token("run", on_token)
        run_hooks = door_hooks(
            "run",
            hooks,
            {
                "on_progress": on_progress,
                "on_report": on_report,
                "on_tool_call": on_tool_call,
                "on_model_call": on_model_call,
                "on_response": on_response,
            },
        )
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
            state = self._new_run(run_id, request.message, history, caller, turn, stored)
            state.clock = self._clock_for(state, run_time, resuming=False)
            state.hooks, state.journal, state.on_token = run_hooks, journal, on_token
            return self._execute(state, append_user=True)
        finally:
            self._release()

    def follow_up(
        self,
        message: str,
        *,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        hooks: RunHooks | None = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
        on_token: TokenHook | None = None,
    ) -> AgentResult:
        """Continue this instance's last finished conversation with `message`."""
        _check_on_token("follow_up", on_token)
        run_hooks = door_hooks(
            "follow_up",
            hooks,
            {
                "on_progress": on_progress,
                "on_report": on_report,
                "on_tool_call": on_tool_call,
                "on_model_call": on_model_call,
                "on_response": on_response,
            },
        )
        with self._lock:
            ever_ran, last = self._ever_ran, self._last
        if not ever_ran:
            raise NoConversationError("never-run")
        if last is None or not last.finished or not last.history:
            raise NoConversationError("last-run-unfinished")
        conversation = self._loop().committed_checkpoint(last)
        return self.run(
            AgentInput(message=message, continue_from=conversation),
            identity=identity,
            time=time,
            hooks=run_hooks,
            on_token=on_token,
        )

    def resume_on_error(
        self,
        checkpoint: AgentRunCheckpoint | Mapping[str, Any] | bytes | str,
        *,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        hooks: RunHooks | None = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
        journal: IterationJournal | None = None,
        on_token: TokenHook | None = None,
    ) -> AgentResult:
        """Re-run the failed turn of `checkpoint`: same history, same turn, nothing appended.
        With `journal`, the iteration in flight continues from it (agent/journal.py)."""
        _check_on_token("resume_on_error", on_token)
        run_hooks = door_hooks(
            "resume_on_error",
            hooks,
            {
                "on_progress": on_progress,
                "on_report": on_report,
                "on_tool_call": on_tool_call,
                "on_model_call": on_model_call,
                "on_response": on_response,
            },
        )
        return self._resume(
            "resume_on_error", checkpoint, identity, time, run_hooks, on_token, journal, {}
        )

    def resume(
        self,
        decisions: Mapping[str, Decision],
        *,
        pause: RunPause | None = None,
        identity: Mapping[str, Any] | None = None,
        time: Any = None,
        hooks: RunHooks | None = None,
        on_progress: ProgressHook | None = None,
        on_report: ReportHook | None = None,
        on_tool_call: ToolCallHook | None = None,
        on_model_call: ModelCallHook | None = None,
        on_response: ResponseHook | None = None,
        on_token: TokenHook | None = None,
    ) -> AgentResult:
        """Answer a paused run (agent/pauses.py): `decisions` by request id, for this
        instance's pause or, from any process, for `pause`. Requests left undecided pause the
        run again. The run goes on with model calls once the paused tools ran, so it streams
        with `on_token` as the other doors do."""
        _check_on_token("resume", on_token)
        run_hooks = door_hooks(
            "resume",
            hooks,
            {
                "on_progress": on_progress,
                "on_report": on_report,
                "on_tool_call": on_tool_call,
                "on_model_call": on_model_call,
                "on_response": on_response,
            },
        )
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
        try:
            return self._resume(
                "resume",
                pause.checkpoint,
                identity,
                time,
                run_hooks,
                on_token,
                pause.journal,
                decisions,
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
        hooks: RunHooks,
        on_token: TokenHook | None,
        journal: IterationJournal | None,
        decisions: Mapping[str, Decision],
    ) -> AgentResult:
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
            state = self._new_run(run_id, message, history, caller, turn, stored)
            recovery = stored.evidence_recovery
            if recovery is not None:
                state.revision_spent = True
                pending = recovery.get("pending")
                state.pending_instruction = pending["instruction"] if pending else None
            state.clock = self._clock_for(state, run_time, resuming=True)
            state.hooks, state.journal, state.on_token = hooks, journal, on_token
            state.person_decisions = decisions
            return self._execute(state, append_user=False)
        finally:
            self._release()

    def checkpoint(self) -> AgentRunCheckpoint | None:
        """The conversation after the last run (None before any run). Only meaningful between
        runs; after a failed run it holds that run's committed history and no answer."""
        with self._lock:
            last = self._last
        return None if last is None else self._loop().committed_checkpoint(last)

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

    def _commit(self, state: RunState) -> None:
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
    ) -> RunState:
        cursor = None
        if stored is not None and self.skills is not None:
            cursor = self.skills.restore(stored.skill_cursor)
        return RunState(
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
        self, state: RunState, run_time: RunTime | None, *, resuming: bool
    ) -> dict[str, Any] | None:
        """The turn's clock: none without a time layer; on a resume, the one the turn already
        fixed, if its ledger holds it; else a new `clock` row, which makes the seed a state a
        fresh start would not rebuild (it would fix another clock)."""
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
        state.seed_rebuildable = False
        return row

    # -- handing the run to the loop --------------------------------------------------------

    def _loop(self) -> Loop:
        """The loop over this agent's configuration as it stands now."""
        return Loop(
            provider=self.provider,
            model=self.model,
            system=self.system,
            agent_id=self.id,
            named=self.named,
            tools_by_name=self._tools_by_name,
            tool_specs=self._tool_specs,
            max_iterations=self.max_iterations,
            input_middleware=self.input_middleware,
            honesty_armed=self.honesty_armed,
            skills=self.skills,
            compaction=self.compaction,
            evidence_check=self.evidence_check,
            tool_timeout_s=self.tool_timeout_s,
            parallel_tools=self.parallel_tools,
            redact_tool_errors=self.redact_tool_errors,
            commit=self._commit,
        )

    def _execute(self, state: RunState, *, append_user: bool) -> AgentResult:
        loop = self._loop()
        ended = loop.execute(state, append_user=append_user)
        if ended.pause is not None:
            with self._lock:
                self._paused = ended.pause
            checkpoint = ended.pause.checkpoint
        else:
            checkpoint = loop.committed_checkpoint(state)
        return AgentResult(
            content=ended.content,
            run_id=state.run_id,
            turn_number=state.turn,
            iterations=state.iteration,
            checkpoint=checkpoint,
            stop_reason=ended.stop_reason,
            usage=dict(state.usage),
            middleware_decisions=state.decisions,
            pause=ended.pause,
        )


def _check_on_token(door: str, on_token: object) -> None:
    if on_token is not None and not callable(on_token):
        raise TypeError(f"[{door}] on_token= must be a function of one agent.TokenDelta")


def _count_users(history: Sequence[Message]) -> int:
    return sum(1 for m in history if m.get("role") == "user")


__all__ = [
    "DEFAULT_AGENT_ID",
    "DEFAULT_MAX_ITERATIONS",
    "MAX_MESSAGE_UTF16_UNITS",
    "WRAP_UP_INSTRUCTION",
    "Agent",
    "AgentError",
    "AgentInput",
    "AgentResult",
    "EvidenceCheck",
    "ModelCallPhase",
    "ModelCallReport",
    "ProgressKind",
    "ProgressReport",
    "RunHooks",
    "StopReason",
    "ToolCallPhase",
    "ToolCallReport",
    "mint_run_id",
    "normalize_input",
]
