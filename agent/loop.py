"""The iteration engine: one run's state (RunState) and the loop that moves it (Loop).

It owns everything between a door's seeded RunState and the run's end: the input chain, model
calls, tool calls (one after another or in parallel), pauses for a person, folding, evidence
revisions, the check points of the run's RunHooks (agent/hooks.py), and the checkpoints it
reports or fails with. It owns no instance state: the Agent (agent/runtime.py) builds a Loop
from its configuration for each door call, seeds the RunState, and receives the state back
through `commit` whenever a run ends, finished or not.

One run is one turn: model call -> tool calls -> next iteration until the model answers.
`max_iterations` is an action budget, as in the reference: when the model still asks for tools
on the last allowed call, those calls do not run, the assistant message carrying them is not
kept, the WRAP_UP_INSTRUCTION user message is appended (and kept), and one more call goes out
with no tools offered; its reply is the turn's answer and it counts as an iteration (p01).

Progress (`after_progress`, persist-then-proceed) is reported at `seeded` (the history is
seeded, before the first model call), `round` (an iteration ended and the loop goes on: its tool
results are in, or, with no tool run, the budget's wrap-up message was appended or an evidence
revision was asked for) and `folded` (compaction folded old messages into a summary). The
checkpoint is the crash-checkpoint shape without failurePoint.

The journal (agent/journal.py): `on_response` sees a response whose tools will run before any
of them runs; a journal the host kept from it and from the tool-call reports lets an
interrupted iteration continue without a second model call and without running a completed
call again. `parallel_tools` runs one response's calls at once, each in a thread of its own;
the tool messages keep the model's order.

Tool timeouts: a tool's `timeout_s`, or else the agent's `tool_timeout_s`, limits each call of
it. A call past its limit is left running in its thread (Python cannot stop one) and its result
is dropped: the tool message says `[timed out] ...`, the `finished` report has `ok` False, the
identical-call note does not count it, and the loop goes on. A tool without a limit runs inline.

Tokens: with the host's `on_token`, a model call goes through the provider's `stream` when it
has one; each piece of text is told to `on_token` as it comes, and the last chunk's response is
used exactly as `complete`'s would be (the same reports, history and checkpoints). A provider
without `stream` is called with `complete` and tells `on_token` nothing. A stream that ends
without its response is a resumable ProviderConnectionError.

How a run ends: with an answer (Ended), a pause (Ended with `pause`), RunStopped (a check point
returned a stop), RunCheckpointError (anything raised inside the loop, a hook's exception
included) or MessageDeniedError (the input chain refused the message).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from agent.checkpoint import AgentRunCheckpoint
from agent.errors import (
    MessageDeniedError,
    ProviderConnectionError,
    RunCheckpointError,
    ToolAbort,
    classify_failure_phase,
    resume_advice,
)
from agent.folding import Compaction
from agent.hooks import (
    NO_HOOKS,
    HookPoint,
    ModelCallPhase,
    ModelCallReport,
    ProgressKind,
    ProgressReport,
    RunHooks,
    RunStopped,
    TokenDelta,
    TokenHook,
    ToolCallPhase,
    ToolCallReport,
)
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
    StreamChunk,
    assistant_message,
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
from agent.timeouts import CallTimedOut, call_with_timeout
from agent.tools import Tool, ToolContext, tool_result_text, unknown_tool_text

# The user message a turn that ran out of its action budget gets, verbatim (p01).
WRAP_UP_INSTRUCTION = (
    "Your action budget for this turn is exhausted. Do not request tools. Give your best final "
    "answer from what you have: what you completed, what remains undone, and anything the "
    "person should know."
)

StopReason = Literal["answer", "max_iterations", "paused"]
EvidenceCheck = Callable[[str, Sequence[Message]], "str | None"]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class RunState:
    """Everything one run changes. Local to the door call that runs it."""

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
    # The host's check points for this run (agent/hooks.py).
    hooks: RunHooks = NO_HOOKS
    # The host's watcher of answer text as it is written; with it, model calls stream.
    on_token: TokenHook | None = None
    # Model calls made so far by this run (ModelCallReport.call_number).
    model_calls: int = 0
    # False once seeding fixed the turn's clock from the time layer: a fresh start would fix
    # another, so the seeded report is not rebuildable (ProgressReport.rebuildable).
    seed_rebuildable: bool = True
    # The iteration in flight as the host kept it; used (and dropped) at the first model call
    # whose history it fits.
    journal: IterationJournal | None = None
    # A person's decisions on the requests of a paused run, by request id.
    person_decisions: Mapping[str, Decision] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Ended:
    """How a run that raised nothing ended: its answer, or a pause."""

    content: str
    stop_reason: StopReason
    pause: RunPause | None = None


class _Paused(Exception):
    """Control flow, not a failure: the iteration waits for a person."""

    def __init__(self, pause: RunPause) -> None:
        super().__init__("paused")
        self.pause = pause


class _Stopped(Exception):
    """Control flow, not a failure: a check point returned a stop. It crosses tool threads as
    any exception does, and `execute` turns it into RunStopped."""

    def __init__(self, point: HookPoint, reason: object) -> None:
        super().__init__(f"stopped at {point}")
        self.point = point
        self.reason = reason


def _go_on(point: HookPoint, returned: object) -> None:
    """The return convention of a check point: None goes on, anything else stops the run."""
    if returned is not None:
        raise _Stopped(point, returned)


@dataclass(frozen=True, slots=True, kw_only=True)
class Loop:
    """The agent's configuration as the loop reads it, fixed for one door call, and `commit`,
    the Agent's keeper of a run's state once the run ends."""

    provider: LLMProvider
    model: str
    system: str
    agent_id: str
    named: bool
    tools_by_name: Mapping[str, Tool]
    tool_specs: list[dict[str, Any]]
    max_iterations: int
    input_middleware: Sequence[InputMiddleware]
    honesty_armed: bool
    skills: SkillGraph | None
    compaction: Compaction | None
    evidence_check: EvidenceCheck | None
    tool_timeout_s: float | None
    parallel_tools: bool
    redact_tool_errors: Callable[[str], str] | None
    commit: Callable[[RunState], None]

    def execute(self, state: RunState, *, append_user: bool) -> Ended:
        """The run, from the input chain to its end. `append_user`: append the (chained)
        message as a new user turn; otherwise only when the history is empty (a resume)."""
        try:
            message, decisions = run_input_chain(
                self.input_middleware, state.raw_message, state.identity
            )
        except MessageDeniedError as denied:
            state.message = denied.denied_message
            if append_user or not state.history:
                state.history = [*state.history, user_message(denied.denied_message)]
            state.progress = list(state.history)
            self.commit(state)
            raise
        state.message, state.decisions = message, decisions
        if append_user or not state.history:
            state.history = [*state.history, user_message(message)]
        if self.skills is not None:
            state.skill_cursor = self.skills.route(message, state.skill_cursor)
        state.progress = list(state.history)
        try:
            self._report(state, ProgressKind.SEEDED)
            content, stop = self._iterate(state)
        except _Paused as paused:
            self.commit(state)
            return Ended("", "paused", paused.pause)
        except _Stopped as stopped:
            self.commit(state)
            raise self._stopped(state, stopped) from None
        except Exception as exc:
            self.commit(state)
            if isinstance(exc, MessageDeniedError):
                raise
            raise self._crash(state, exc) from exc
        state.answer, state.finished = unicode_text(content), True
        self.commit(state)
        return Ended(state.answer, stop)

    # -- iterations -------------------------------------------------------------------------

    def _iterate(self, state: RunState) -> tuple[str, StopReason]:
        wrapping_up = False
        while True:
            state.iteration += 1
            self._maybe_fold(state)
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
                        self._report(state, ProgressKind.ROUND)
                        continue
                    return response.content, "answer"
                if state.iteration < self.max_iterations:
                    message = assistant_message(response)
                    report = ResponseReport(state.iteration, len(state.history), message)
                    _go_on(HookPoint.ON_RESPONSE, state.hooks.on_response(report))
                    self._run_tools(state, message, None)
                elif self.tool_specs:
                    self._ask_for_wrap_up(state)
                    wrapping_up = True
                else:
                    # No tools to withhold, so no wrap-up (the reference mounts it only on an
                    # agent that can call tools): the turn is cut short with this reply's text.
                    return response.content, "max_iterations"
            state.last_completed = state.iteration
            state.progress = list(state.history)
            self._report(state, ProgressKind.ROUND)

    def _take_journal(self, state: RunState) -> IterationJournal | None:
        """The host's journal, once, if it is of this point of the history."""
        journal, state.journal = state.journal, None
        if journal is None or journal.history_length != len(state.history):
            return None
        return journal

    def _ask_for_wrap_up(self, state: RunState) -> None:
        """The budget is spent and the model still wants tools: the calls do not run and the
        message carrying them is not kept (its text would be a fragment); the ask is kept."""
        state.history = [*state.history, user_message(WRAP_UP_INSTRUCTION)]

    def _needs_revision(self, state: RunState, answer: str) -> bool:
        if self.evidence_check is None or state.revision_spent:
            return False
        instruction = self.evidence_check(answer, list(state.history))
        if not instruction:
            return False
        state.revision_spent = True
        state.pending_instruction = instruction
        return True

    def _maybe_fold(self, state: RunState) -> None:
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
        self._report(state, ProgressKind.FOLDED)

    # -- model calls ------------------------------------------------------------------------

    def _call_model(self, state: RunState, *, offer_tools: bool) -> LLMResponse:
        state.bracket = ("llm", "call-llm")
        request = self._request(state, offer_tools=offer_tools)
        state.model_calls += 1
        hooks = state.hooks
        started = self._model_report(state, ModelCallPhase.STARTED, request=request)
        _go_on(HookPoint.BEFORE_MODEL_CALL, hooks.before_model_call(started))
        try:
            response = self._answer(state, request)
        except Exception as exc:
            failed = self._model_report(state, ModelCallPhase.FINISHED, error=exc)
            _go_on(HookPoint.AFTER_MODEL_CALL, hooks.after_model_call(failed))
            raise
        usage = None if response.usage is None else _int_usage(response.usage)
        finished = self._model_report(state, ModelCallPhase.FINISHED, usage=usage)
        _go_on(HookPoint.AFTER_MODEL_CALL, hooks.after_model_call(finished))
        state.bracket = None
        _add_usage(state.usage, response.usage)
        if state.pending_instruction is not None:
            state.pending_instruction = None  # the request that carried it completed
        return response

    def _answer(self, state: RunState, request: LLMRequest) -> LLMResponse:
        """The provider's reply to `request`. When the host watches the tokens it is streamed
        if the provider can, each piece of text told to `on_token`; a provider that cannot is
        called with `complete` and tells nothing: its text arrives with the reply, all at
        once, as it would without `on_token` (a job system then writes no token events for
        it)."""
        on_token = state.on_token
        stream = getattr(self.provider, "stream", None) if on_token is not None else None
        if on_token is None or not callable(stream):
            return self._checked(self.provider.complete(request))
        chunks = stream(request)
        try:
            for chunk in chunks:
                if not isinstance(chunk, StreamChunk):
                    raise TypeError(
                        f"provider {self._provider_name()} streamed "
                        f"{type(chunk).__name__}, not a StreamChunk"
                    )
                if chunk.text:
                    on_token(TokenDelta(state.iteration, chunk.text))
                if chunk.response is not None:
                    return self._checked(chunk.response)
        finally:
            close = getattr(chunks, "close", None)
            if callable(close):  # an abandoned HTTP stream gives its connection back now
                close()
        raise ProviderConnectionError(
            f"provider {self._provider_name()}: the stream ended without its final response; "
            "the call can be retried"
        )

    def _checked(self, response: object) -> LLMResponse:
        if not isinstance(response, LLMResponse):
            raise TypeError(
                f"provider {self._provider_name()} returned "
                f"{type(response).__name__}, not an LLMResponse"
            )
        return response

    def _provider_name(self) -> str:
        return str(getattr(self.provider, "name", None) or type(self.provider).__name__)

    def _model_report(
        self,
        state: RunState,
        phase: ModelCallPhase,
        *,
        usage: Mapping[str, int] | None = None,
        error: Exception | None = None,
        request: LLMRequest | None = None,
    ) -> ModelCallReport:
        ok = None if phase is ModelCallPhase.STARTED else error is None
        cap = getattr(self.provider, "max_tokens", None) if request is not None else None
        status = getattr(error, "status", None)
        retry_after = getattr(error, "retry_after_s", None)
        return ModelCallReport(
            phase=phase,
            model=self.model,
            iteration=state.iteration,
            ok=ok,
            usage=usage,
            error_type=None if error is None else type(error).__name__,
            provider=self._provider_name(),
            call_number=state.model_calls,
            request=request,
            output_cap=cap if isinstance(cap, int) and not isinstance(cap, bool) else None,
            error_status=status if isinstance(status, int) else None,
            retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
        )

    def _request(self, state: RunState, *, offer_tools: bool) -> LLMRequest:
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
            tools=self.tool_specs if offer_tools else [],
            model=self.model,
            run_id=state.run_id,
            iteration=state.iteration,
        )

    # -- tool calls -------------------------------------------------------------------------

    def _run_tools(
        self, state: RunState, message: Message, journal: IterationJournal | None
    ) -> None:
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
            raise _Paused(self._pause(state, message, outcomes, journaled, waiting))
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
        state: RunState,
        calls: Sequence[tuple[int, Mapping[str, Any]]],
        journaled: Mapping[int, JournaledCall],
    ) -> dict[int, tuple[str, bool]]:
        """Every call at once, each in its own thread (in a copy of the caller's context). All
        of them end before the first failure or stop, in the model's order, is raised: a call
        that completed has reported its outcome, so a host keeps it."""
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
        self,
        state: RunState,
        calls: Sequence[Mapping[str, Any]],
        journal: IterationJournal | None,
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
            found = self.tools_by_name.get(call["name"])
            if found is None or (done is not None and (done.completed or done.attempts > 0)):
                continue
            request = person_request(found, index, call, self._tool_context(state, call, "", 1))
            if request is not None:
                requests[index] = request
        return requests

    def _pause(
        self,
        state: RunState,
        message: Message,
        outcomes: Mapping[int, tuple[str, bool]],
        journaled: Mapping[int, JournaledCall],
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
        checkpoint = self.progress_checkpoint(state, failure=None)
        return RunPause(checkpoint, journal, tuple(waiting))

    def _call_tool(
        self,
        state: RunState,
        index: int,
        call: Mapping[str, Any],
        journaled: JournaledCall | None,
    ) -> tuple[str, bool]:
        """The tool result text, and whether it landed: a result of the tool, which the
        identical-call note counts (a call to an unknown tool or a timed-out call is not)."""
        name, call_id = call["name"], call["id"]
        found = self.tools_by_name.get(name)
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
        hooks = state.hooks
        _go_on(HookPoint.BEFORE_TOOL_CALL, hooks.before_tool_call(report(ToolCallPhase.STARTED)))
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
        finished = report(ToolCallPhase.FINISHED, ok=ok, content=text, landed=landed)
        _go_on(HookPoint.AFTER_TOOL_CALL, hooks.after_tool_call(finished))
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
        self, state: RunState, call: Mapping[str, Any], key: str, attempt: int
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

    # -- reports and checkpoints ------------------------------------------------------------

    def _report(self, state: RunState, kind: ProgressKind) -> None:
        """Persist-then-proceed: the check point returns before the loop goes on."""
        rebuildable = kind is ProgressKind.SEEDED and state.seed_rebuildable
        report = ProgressReport(kind, self.progress_checkpoint(state, failure=None), rebuildable)
        _go_on(HookPoint.AFTER_PROGRESS, state.hooks.after_progress(report))

    def _common(self, state: RunState) -> dict[str, Any]:
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
            "agent": {"id": self.agent_id} if self.named else None,
            "extra": state.extra,
        }

    def progress_checkpoint(
        self, state: RunState, failure: dict[str, Any] | None
    ) -> AgentRunCheckpoint:
        """The crash-checkpoint shape: history as of the last completed tool round."""
        return AgentRunCheckpoint(
            run_id=state.run_id,
            history=list(state.progress),
            last_completed_iteration=state.last_completed,
            original_input={"message": state.raw_message},
            checkpointed_at=now_ms(),
            failure_point=failure,
            **self._common(state),
        )

    def committed_checkpoint(self, state: RunState) -> AgentRunCheckpoint:
        """The conversation after the run: its answer included once it finished."""
        history = list(state.progress if not state.finished else state.history)
        if state.finished and state.answer:
            history.append({"role": "assistant", "content": state.answer})
        return AgentRunCheckpoint(
            run_id=state.run_id,
            history=history,
            last_completed_iteration=state.iteration,
            original_input={"message": state.message},
            checkpointed_at=now_ms(),
            **self._common(state),
        )

    def _failure_point(self, state: RunState, unbracketed_phase: str) -> dict[str, Any]:
        """Where the run ended: the open llm/tool bracket, else `unbracketed_phase`."""
        failure: dict[str, Any] = {"iteration": state.iteration or state.last_completed + 1}
        if state.bracket is not None:
            failure["phase"], failure["stage"] = state.bracket
        else:
            failure["phase"] = unbracketed_phase
        return failure

    def _crash(self, state: RunState, exc: Exception) -> RunCheckpointError:
        failure = self._failure_point(state, classify_failure_phase(exc))
        iteration = failure["iteration"]
        checkpoint = self.progress_checkpoint(state, failure)
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

    def _stopped(self, state: RunState, stopped: _Stopped) -> RunStopped:
        # With no llm/tool bracket open (on_response, after_progress) the run stopped between
        # a model call and its tools, or between iterations.
        failure = self._failure_point(state, "iteration")
        return RunStopped(
            reason=stopped.reason,
            point=stopped.point,
            checkpoint=self.progress_checkpoint(state, failure),
            phase=failure["phase"],
            iteration=failure["iteration"],
        )


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
    "Ended",
    "EvidenceCheck",
    "Loop",
    "RunState",
    "StopReason",
    "now_ms",
]
