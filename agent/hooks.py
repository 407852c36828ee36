"""What a run tells its host, and how the host steers it: the reports, RunHooks, RunStopped.

A host passes one `RunHooks` object to a door (`run`, `follow_up`, `resume_on_error`,
`resume`) with `hooks=`. The run calls its methods, the check points, at these moments:

- `before_model_call(ModelCallReport)`: phase `started`, just before the provider's
  `complete` (or `stream`, see Tokens), the request already built. A stop here: the model is
  not called.
- `after_model_call(ModelCallReport)`: phase `finished`, just after `complete` returned (`ok`
  True, `usage`) or raised (`ok` False, `error_type`); for a streamed call, once its last chunk
  came or it failed. A stop here: the response is dropped
  (nothing of it reaches the history, its usage is not counted) and, when the provider raised,
  the run ends with RunStopped instead of that error.
- `on_response(ResponseReport)`: a response whose tools will run, before any of them runs (the
  journal point, agent/journal.py). Not called for a final answer, nor for a response whose
  tools do not run because the action budget is spent. A stop here: none of its tools runs.
- `before_tool_call(ToolCallReport)`: phase `started`, just before a registered tool runs. A
  stop here: this tool does not run and, when the calls run one after another, neither do the
  response's later calls.
- `after_tool_call(ToolCallReport)`: phase `finished`, just after the tool returned, raised or
  timed out (`ok`, `content`, `landed`). A stop here: the tool has run (the report holds its
  outcome); the later calls do not run when the calls run one after another.
- `after_progress(ProgressReport)`: the conversation moved (`seeded`, `round`, `folded`) and the
  checkpoint is the progress so far. The loop goes on only once it returns (persist, then
  proceed). A stop here: the loop does not go on (after `seeded`, the model is never called).

The tool check points are called only around a registered tool that runs: a call to an
unknown tool, a call whose outcome the journal already holds (completed, or unsafe and
interrupted), a call waiting for a person and one a person rejected or answered run nothing
and report nothing.

Threading: every check point is called on the thread that called the door, except the two tool
check points of a run with `parallel_tools=True` and more than one call to run: those are
called from the calls' own threads (each in a copy of the door caller's contextvars), several
at once, so they must be thread-safe. The run holds nothing of its own in the hooks object; one
object may serve many runs if its own state allows it.

The return convention: a check point returns None to let the run go on. Anything else (a
`Stop(reason)`, or any object of the host's own, an exception instance included; False and 0
too) stops the run there: the door raises `RunStopped`, whose `.reason` is exactly the object
returned, `.point` the HookPoint, `.checkpoint` the run's last progress (the crash-checkpoint
shape, with a failurePoint saying where it stopped, so `resume_on_error` continues from it) and
`.phase` that failurePoint's phase. With `parallel_tools`, calls already running when one
stops still finish and call their own check points; the first stop or failure in the model's
order of the calls then ends the run. A check point that RAISES still stops the run with
`RunCheckpointError`, its cause that exception, exactly as the keyword hooks always have.

Tokens: a door's `on_token` (a callable of one `TokenDelta`) is not a check point: it is called
on the door's thread with each piece of answer text as the model writes it (a provider that
cannot stream tells it nothing), between `before_model_call` and `after_model_call`,
and what it returns is ignored. It may be given
together with `hooks=`. One that raises fails the model call (`after_model_call` reports it, `ok`
False) and the run, as a check point that raises does.

The keyword hooks (`on_progress`, `on_report`, `on_tool_call`, `on_model_call`,
`on_response`) are an adapter over RunHooks (`keyword_hooks`): they see the same reports at the
same points, and what they return is ignored, so they never stop a run by returning. A door
refuses `hooks=` together with a keyword hook (TypeError): one hooks object per run, built by
the host the way it wants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.checkpoint import AgentRunCheckpoint
from agent.errors import AgentError
from agent.journal import ResponseReport, ToolEffect
from agent.messages import LLMRequest


class ProgressKind(StrEnum):
    """What moved the conversation when a progress report was made."""

    SEEDED = "seeded"  # the turn's history is seeded: after the input chain, before any call
    ROUND = "round"  # an iteration ended and the loop goes on
    FOLDED = "folded"  # compaction folded old messages into a summary


@dataclass(frozen=True, slots=True)
class ProgressReport:
    kind: ProgressKind
    checkpoint: AgentRunCheckpoint
    # True when a fresh start of the same door with the same input would build this very
    # checkpoint again (given input middleware that answers the same way), so a host need not
    # persist it. Only a `seeded` report can be: it is, unless seeding fixed the turn's clock
    # from the time layer (a `run` or `follow_up` of an agent with a time layer, or a resume
    # whose turn had no clock yet), since a fresh start would fix another one.
    rebuildable: bool = False


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
    # The model call's number within this run (this door call), from 1; both phases of one
    # call carry the same number. It differs from `iteration` when an iteration needed no model
    # call (one continued from a journal).
    call_number: int = 1
    # For `started`: the request about to be sent, and the provider's output cap (its integer
    # `max_tokens` attribute, None without one): what a host meters the call by.
    request: LLMRequest | None = field(default=None, compare=False, repr=False)
    output_cap: int | None = None
    # For `finished` with ok False: the provider's HTTP status and retry-after (ProviderError).
    error_status: int | None = None
    retry_after_s: float | None = None

    @property
    def first_call(self) -> bool:
        """Whether this is the run's first model call."""
        return self.call_number == 1


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """Answer text as the model writes it: `iteration` is the iteration of the model call (from
    1, as AgentResult.iterations counts), `text` the piece it adds (never empty)."""

    iteration: int
    text: str


class HookPoint(StrEnum):
    """The check points, named as RunHooks' methods."""

    BEFORE_MODEL_CALL = "before_model_call"
    AFTER_MODEL_CALL = "after_model_call"
    ON_RESPONSE = "on_response"
    BEFORE_TOOL_CALL = "before_tool_call"
    AFTER_TOOL_CALL = "after_tool_call"
    AFTER_PROGRESS = "after_progress"


@dataclass(frozen=True, slots=True)
class Stop:
    """A ready value for a check point to return to stop the run, for a host without a reason
    type of its own: `return Stop("cancelled by the user")`."""

    reason: object = None


class RunHooks:
    """The host's side of a run: subclass it and override the check points you need (see the
    module doc for when each is called, from which thread, and what a stop there does). Each
    default does nothing and returns None: go on."""

    def before_model_call(self, report: ModelCallReport) -> object:
        """Just before the provider is called. A stop: the model is not called."""
        return None

    def after_model_call(self, report: ModelCallReport) -> object:
        """Just after the provider returned or raised. A stop: the response is dropped."""
        return None

    def on_response(self, report: ResponseReport) -> object:
        """A response whose tools will run, before any of them does. A stop: none runs."""
        return None

    def before_tool_call(self, report: ToolCallReport) -> object:
        """Just before a registered tool runs. A stop: it does not run."""
        return None

    def after_tool_call(self, report: ToolCallReport) -> object:
        """Just after a tool returned, raised or timed out. A stop: no later call runs."""
        return None

    def after_progress(self, report: ProgressReport) -> object:
        """The conversation moved; the loop waits for this. A stop: the loop does not go on."""
        return None


class RunStopped(AgentError):
    """A check point of the run's RunHooks returned a value other than None.

    `reason` is that value, unchanged; `point` the HookPoint that returned it; `checkpoint` the
    last progress, shaped like a crash checkpoint (its failurePoint says where the run stopped;
    `resume_on_error` continues from it); `phase` that failurePoint's phase (`llm` at the model
    call check points, `tool` at the tool call ones, `iteration` at `on_response` and
    `after_progress`); `iteration` the iteration the run stopped in. Not a RunCheckpointError:
    there is no failure to unwrap.
    """

    code = "ERR_RUN_STOPPED"

    def __init__(
        self,
        *,
        reason: object,
        point: HookPoint,
        checkpoint: AgentRunCheckpoint,
        phase: str,
        iteration: int,
    ) -> None:
        self.reason = reason
        self.point = point
        self.checkpoint = checkpoint
        self.phase = phase
        self.iteration = iteration
        # The reason's type only: its text is the host's and may hold what a log must not.
        super().__init__(
            f"[agent run] the host stopped the run at {point} in iteration {iteration} "
            f"(reason: {type(reason).__name__}; see .reason). Last-good checkpoint captured at "
            f"iteration {checkpoint.last_completed_iteration}; agent.resume_on_error(checkpoint) "
            "continues from it."
        )


ProgressHook = Callable[[AgentRunCheckpoint], object]
ReportHook = Callable[[ProgressReport], object]
ToolCallHook = Callable[[ToolCallReport], object]
ModelCallHook = Callable[[ModelCallReport], object]
ResponseHook = Callable[[ResponseReport], object]
TokenHook = Callable[[TokenDelta], object]

NO_HOOKS = RunHooks()


class _KeywordHooks(RunHooks):
    """The five keyword hooks as one RunHooks. What they return is ignored: they go on."""

    def __init__(
        self,
        on_progress: ProgressHook | None,
        on_report: ReportHook | None,
        on_tool_call: ToolCallHook | None,
        on_model_call: ModelCallHook | None,
        on_response: ResponseHook | None,
    ) -> None:
        self._on_progress = on_progress
        self._on_report = on_report
        self._on_tool_call = on_tool_call
        self._on_model_call = on_model_call
        self._on_response = on_response

    def before_model_call(self, report: ModelCallReport) -> None:
        if self._on_model_call is not None:
            self._on_model_call(report)

    def after_model_call(self, report: ModelCallReport) -> None:
        if self._on_model_call is not None:
            self._on_model_call(report)

    def on_response(self, report: ResponseReport) -> None:
        if self._on_response is not None:
            self._on_response(report)

    def before_tool_call(self, report: ToolCallReport) -> None:
        if self._on_tool_call is not None:
            self._on_tool_call(report)

    def after_tool_call(self, report: ToolCallReport) -> None:
        if self._on_tool_call is not None:
            self._on_tool_call(report)

    def after_progress(self, report: ProgressReport) -> None:
        # on_progress first, then on_report; when on_progress raises, on_report is not called.
        if self._on_progress is not None:
            self._on_progress(report.checkpoint)
        if self._on_report is not None:
            self._on_report(report)


def keyword_hooks(
    on_progress: ProgressHook | None = None,
    on_report: ReportHook | None = None,
    on_tool_call: ToolCallHook | None = None,
    on_model_call: ModelCallHook | None = None,
    on_response: ResponseHook | None = None,
) -> RunHooks:
    """The keyword hooks as one RunHooks (the no-op one when none is given)."""
    given = (on_progress, on_report, on_tool_call, on_model_call, on_response)
    if all(hook is None for hook in given):
        return NO_HOOKS
    return _KeywordHooks(*given)


def door_hooks(door: str, hooks: RunHooks | None, keywords: Mapping[str, Any]) -> RunHooks:
    """The one hooks object of a door's run: `hooks=`, or else the keyword hooks (`keywords`,
    by keyword name, None for one not given). Refuses both at once, and a `hooks=` that is not
    a RunHooks."""
    given = sorted(name for name, hook in keywords.items() if hook is not None)
    if hooks is None:
        return keyword_hooks(**keywords)
    if not isinstance(hooks, RunHooks):
        raise TypeError(
            f"[{door}] hooks= must be a RunHooks (subclass agent.RunHooks and override the "
            f"check points you need), not {type(hooks).__name__}"
        )
    if given:
        raise TypeError(
            f"[{door}] pass hooks= or the keyword hooks, not both (got hooks= and "
            f"{', '.join(f'{name}=' for name in given)}): put those calls in the RunHooks"
        )
    return hooks


__all__ = [
    "HookPoint",
    "ModelCallHook",
    "ModelCallPhase",
    "ModelCallReport",
    "ProgressHook",
    "ProgressKind",
    "ProgressReport",
    "ReportHook",
    "ResponseHook",
    "RunHooks",
    "RunStopped",
    "Stop",
    "TokenDelta",
    "TokenHook",
    "ToolCallHook",
    "ToolCallPhase",
    "ToolCallReport",
    "door_hooks",
    "keyword_hooks",
]
