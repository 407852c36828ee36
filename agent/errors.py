"""The runtime's error tree, failure classification and `can_resume`.

    AgentError                      every error this package raises on purpose (.code)
    ├── CheckpointFormatError       also a TypeError; .field names what is wrong
    ├── InvalidRunInputError        also a ValueError; .field names what is wrong
    ├── RunInFlightError            this Agent instance already runs a turn
    ├── RunPausedError              this Agent instance's last run waits for a person
    ├── NoConversationError         follow_up with nothing finished to follow (.reason)
    ├── ConversationMismatchError   a named agent continuing another named agent's conversation
    ├── MessageDeniedError          the input middleware chain denied the message
    ├── RunCheckpointError          a run failed; .checkpoint resumes it, .cause is the failure
    ├── RunStopped                  a RunHooks check point stopped the run (.reason, .point,
    │                               .checkpoint, .phase); defined in agent/hooks.py
    ├── ToolAbort                   a tool's way to fail the run instead of telling the model
    └── ProviderError               a model call failed (.status, .retry_after_s)
        ├── ProviderHTTPError       the provider answered with an error status
        ├── ProviderTimeoutError    no answer within the timeout
        ├── ProviderConnectionError no connection, or it broke
        └── ProviderResponseError   an answer that could not be read

`can_resume` (docs/checkpoint.md, "Resumability") and `classify_failure_phase` (docs/checkpoint.md,
"Failure phase classification") read any exception, not only
these: providers of other libraries raise their own types.
"""

from __future__ import annotations

import math
import re
from typing import Any


class AgentError(Exception):
    code = "ERR_AGENT"


class CheckpointFormatError(AgentError, TypeError):
    """A checkpoint that cannot be loaded. `field` is the key path (`history[3].content`)."""

    code = "ERR_CHECKPOINT_FORMAT"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"[resume_on_error] invalid checkpoint: {field}: {problem}")


class InvalidRunInputError(AgentError, ValueError):
    code = "ERR_INVALID_RUN_INPUT"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"[agent run] invalid input: {field}: {problem}")


class RunInFlightError(AgentError):
    code = "ERR_RUN_IN_FLIGHT"

    def __init__(self, door: str, agent_id: str, active_run_id: str) -> None:
        self.agent_id = agent_id
        self.active_run_id = active_run_id
        super().__init__(
            f"[{door}] agent '{agent_id}' already has run {active_run_id} in flight; one Agent "
            "instance runs one turn at a time: wait for it, or use another instance"
        )


class RunPausedError(AgentError):
    """The instance's last run is paused for a person's decision: answer it first."""

    code = "ERR_RUN_PAUSED"

    def __init__(self, door: str, pending: int) -> None:
        self.door = door
        self.pending = pending
        super().__init__(
            f"[{door}] this agent's last run is paused, waiting for {pending} decision(s) of a "
            "person: answer it with agent.resume(decisions) or drop it with agent.abandon_pause()"
        )


class NoConversationError(AgentError):
    code = "ERR_NO_CONVERSATION"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        advice = {
            "never-run": "this agent has not run yet; call run() first",
            "last-run-unfinished": (
                "the last run did not finish; resume it with resume_on_error(error.checkpoint) "
                "or start a new conversation with run()"
            ),
        }.get(reason, reason)
        super().__init__(f"[follow_up] no conversation to follow ({reason}): {advice}")


class ConversationMismatchError(AgentError):
    code = "ERR_CONVERSATION_MISMATCH"

    def __init__(self, door: str, stored_agent_id: str, agent_id: str) -> None:
        self.stored_agent_id = stored_agent_id
        self.agent_id = agent_id
        super().__init__(
            f"[{door}] the conversation was recorded by agent '{stored_agent_id}' and cannot be "
            f"continued by agent '{agent_id}'; route it to '{stored_agent_id}'"
        )


class MessageDeniedError(AgentError):
    code = "ERR_MESSAGE_DENIED"

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.denied_message = message
        super().__init__(f"[agent run] the input middleware denied the message: {reason}")


class ToolAbort(AgentError):
    """Raise from a tool to fail the whole run (RunCheckpointError, phase 'tool').

    Any other exception a tool raises becomes the tool result the model reads.
    """

    code = "ERR_TOOL_ABORT"


class ProviderError(AgentError):
    """A model call failed. Messages never carry an API key or an endpoint URL."""

    code = "ERR_PROVIDER"

    def __init__(
        self, message: str, *, status: int | None = None, retry_after_s: float | None = None
    ) -> None:
        self.status = status
        self.retry_after_s = retry_after_s
        super().__init__(message)


class ProviderHTTPError(ProviderError):
    code = "ERR_PROVIDER_HTTP"


class ProviderTimeoutError(ProviderError):
    code = "ERR_PROVIDER_TIMEOUT"


class ProviderConnectionError(ProviderError):
    code = "ERR_PROVIDER_CONNECTION"


class ProviderResponseError(ProviderError):
    code = "ERR_PROVIDER_RESPONSE"


class RunCheckpointError(AgentError):
    code = "ERR_RUN_CHECKPOINT"
    name = "RunCheckpointError"

    def __init__(self, message: str, *, checkpoint: Any, cause: BaseException) -> None:
        self.checkpoint = checkpoint
        self.cause = cause
        super().__init__(message)
        self.__cause__ = cause


# ---------------------------------------------------------------------------------------------
# can_resume (docs/checkpoint.md, "Resumability")

_CONTEXT_WINDOW = re.compile(
    r"context_length_exceeded"
    r"|maximum context length"
    r"|prompt is too long"
    r"|exceeds? context limit"
    r"|input (?:is )?too long for (?:the )?requested model"
    r"|input tokens exceed the configured limit"
    r"|exceeds? the maximum (?:allowed )?(?:number of )?input tokens"
    r"|input token count[^.]{0,80}exceeds the maximum number of tokens allowed",
    re.IGNORECASE,
)
_AUTH_NAMES = re.compile(
    r"UnrecognizedClientException|ExpiredTokenException|InvalidSignatureException"
    r"|IncompleteSignatureException|MissingAuthenticationTokenException|InvalidClientTokenId"
    r"|AccessDenied.*|AuthFailure|CredentialsError|UnauthorizedException|AuthenticationError"
    r"|PermissionDeniedError",
    re.IGNORECASE,
)
_AUTH_TEXT = re.compile(r"invalid[_ -]?api[_ -]?key|incorrect api key|no api key provided", re.I)
_MAX_CAUSE_DEPTH = 4


def error_name(err: BaseException) -> str:
    """The JS-style name: an explicit `name` attribute, else the class name."""
    name = getattr(err, "name", None)
    return name if isinstance(name, str) and name else type(err).__name__


def error_status(err: BaseException) -> float | None:
    """The first finite number among the top-level status fields (never a nested cause's)."""
    candidates: list[Any] = [
        getattr(err, "status", None),
        getattr(err, "statusCode", None),
        getattr(err, "status_code", None),
    ]
    metadata = getattr(err, "metadata", None) or getattr(err, "$metadata", None)
    if isinstance(metadata, dict):
        candidates.append(metadata.get("httpStatusCode"))
    for value in candidates:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _chain_text(err: BaseException) -> str:
    parts: list[str] = []
    current: Any = err
    for _ in range(_MAX_CAUSE_DEPTH + 1):
        if current is None:
            break
        if isinstance(current, BaseException):
            parts += [str(current), error_name(current)]
        for attr in ("code", "type"):
            value = getattr(current, attr, None)
            if isinstance(value, str):
                parts.append(value)
        nxt = getattr(current, "error", None)
        if not isinstance(nxt, BaseException):
            nxt = getattr(current, "cause", None) or getattr(current, "__cause__", None)
        current = nxt if nxt is not current else None
    return " ".join(parts)


def not_resumable_reason(err: BaseException) -> str | None:
    """Why `err` cannot be retried: 'context-window', 'auth', 'malformed-request', or None."""
    if isinstance(err, RunCheckpointError):
        err = err.cause
    text = _chain_text(err)
    if "ERR_CONTEXT_WINDOW_EXCEEDED" in text or _CONTEXT_WINDOW.search(text):
        return "context-window"
    status = error_status(err)
    if status in (401.0, 403.0):
        return "auth"
    if _AUTH_NAMES.fullmatch(error_name(err)) or _AUTH_TEXT.search(str(err)):
        return "auth"
    if status in (400.0, 404.0, 422.0):
        return "malformed-request"
    return None


def can_resume(err: BaseException) -> bool:
    """False for a context-window overflow, an auth failure or a malformed request; else True.

    A RunCheckpointError is judged by its cause.
    """
    return not_resumable_reason(err) is None


_RESUME_ADVICE = {
    None: "Pass it to agent.resume_on_error(checkpoint) to continue.",
    "context-window": (
        "Not resumable: the conversation exceeds the model's context window; resuming would "
        "fail the same way. Shorten or compact the history first."
    ),
    "auth": "Not resumable: the provider refused the credentials; fix them, then resume.",
    "malformed-request": (
        "Not resumable: the provider refused the request as malformed; resuming would send it "
        "again unchanged."
    ),
}


def resume_advice(err: BaseException) -> str:
    return _RESUME_ADVICE[not_resumable_reason(err)]


# ---------------------------------------------------------------------------------------------
# failure phase (docs/checkpoint.md, "Failure phase classification"), used when no llm/tool
# bracket was open

_LLM_NAMES = {"AnthropicError", "OpenAIError", "BedrockError"}
_LLM_WORDS = re.compile(r"\b(?:LLM|provider|anthropic|openai|bedrock)\b", re.I | re.ASCII)
_TOOL_NAME = re.compile(r"\b(?:tool|tool_call)\b", re.I | re.ASCII)
_TOOL_WORD = re.compile(r"\bTool\b", re.ASCII)
_ITERATION = re.compile(r"iteration", re.I)


def classify_failure_phase(err: BaseException) -> str:
    name = error_name(err)
    message = str(err)
    if getattr(err, "code", None) == "ERR_CIRCUIT_OPEN" or name in _LLM_NAMES:
        return "llm"
    if _LLM_WORDS.search(message):
        return "llm"
    if _TOOL_NAME.search(name) or _TOOL_WORD.search(message):
        return "tool"
    if _ITERATION.search(message):
        return "iteration"
    return "unknown"
