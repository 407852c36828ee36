"""The error tree's promises: can_resume (docs/checkpoint.md, "Resumability") and the
failure-phase classifier
used when no llm/tool bracket was open ("Failure phase classification"). Both read any
exception, not only ours."""

from __future__ import annotations

from typing import Any

import pytest

from agent import (
    AgentError,
    CheckpointFormatError,
    ConversationMismatchError,
    InvalidRunInputError,
    NoConversationError,
    ProviderHTTPError,
    RunCheckpointError,
    RunInFlightError,
    can_resume,
    classify_failure_phase,
)


class ForeignError(Exception):
    """An exception from some other library: JS-style fields set as attributes."""

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        for key, value in fields.items():
            setattr(self, key, value)


def chained(depth: int, innermost: BaseException, via: str = "cause") -> BaseException:
    """`innermost` wrapped `depth` times, each wrapper pointing down through `.cause`/`.error`."""
    current = innermost
    for level in range(depth):
        current = ForeignError(f"wrapper {level}", **{via: current})
    return current


# ---------------------------------------------------------------------------------------------
# "Edge cases", item 10, and the three classes of "Resumability"


def test_edge_case_10_status_429_is_resumable() -> None:
    assert can_resume(ForeignError("Too Many Requests", status=429)) is True


def test_edge_case_10_access_denied_by_name_is_not_resumable() -> None:
    assert can_resume(ForeignError("nope", name="AccessDeniedException")) is False


def test_edge_case_10_prompt_is_too_long_is_not_resumable() -> None:
    assert can_resume(ForeignError("400: prompt is too long: 210000 tokens > 200000")) is False


@pytest.mark.parametrize(
    "text",
    [
        "context_length_exceeded",
        "This model's maximum context length is 8192 tokens",
        "Prompt Is Too Long",
        "request exceeds context limit",
        "input exceed context limit",
        "Input is too long for requested model.",
        "input too long for the requested model",
        "Input tokens exceed the configured limit of 272000 tokens",
        "exceeds the maximum number of input tokens",
        "exceed the maximum allowed input tokens",
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)",
    ],
)
def test_context_window_phrases_are_not_resumable(text: str) -> None:
    assert can_resume(ForeignError(text)) is False


def test_context_window_by_code() -> None:
    assert can_resume(ForeignError("too big", code="ERR_CONTEXT_WINDOW_EXCEEDED")) is False


@pytest.mark.parametrize("attr", ["code", "type", "name"])
def test_context_window_phrase_in_code_type_or_name(attr: str) -> None:
    assert can_resume(ForeignError("bad request", **{attr: "context_length_exceeded"})) is False


def test_input_token_count_phrase_needs_the_tail_within_eighty_chars_without_a_period() -> None:
    near = "input token count 99 " + "x" * 60 + " exceeds the maximum number of tokens allowed"
    far = "input token count 99 " + "x" * 90 + " exceeds the maximum number of tokens allowed"
    broken = "input token count 99. It exceeds the maximum number of tokens allowed"
    assert can_resume(ForeignError(near)) is False
    assert can_resume(ForeignError(far)) is True
    assert can_resume(ForeignError(broken)) is True


@pytest.mark.parametrize("via", ["cause", "error"])
def test_context_window_is_found_down_the_cause_chain(via: str) -> None:
    deep = chained(3, ForeignError("prompt is too long"), via=via)
    assert can_resume(deep) is False


def test_python_exception_chaining_counts_as_a_cause() -> None:
    try:
        try:
            raise ForeignError("maximum context length is 128000 tokens")
        except ForeignError as inner:
            raise RuntimeError("provider call failed") from inner
    except RuntimeError as outer:
        assert can_resume(outer) is False


def test_the_cause_chain_is_followed_only_a_few_levels() -> None:
    assert can_resume(chained(10, ForeignError("prompt is too long"))) is True


@pytest.mark.parametrize("status", [401, 403])
def test_auth_statuses_are_not_resumable(status: int) -> None:
    assert can_resume(ForeignError("denied", status=status)) is False


@pytest.mark.parametrize("status", [400, 404, 422])
def test_malformed_request_statuses_are_not_resumable(status: int) -> None:
    assert can_resume(ForeignError("bad", status=status)) is False


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 529, 408])
def test_other_statuses_are_resumable(status: int) -> None:
    assert can_resume(ForeignError("upstream trouble", status=status)) is True


def test_status_code_and_metadata_http_status_code_count() -> None:
    assert can_resume(ForeignError("denied", statusCode=401)) is False
    bedrock = ForeignError("denied")
    setattr(bedrock, "$metadata", {"httpStatusCode": 403})  # not an identifier: no dot syntax
    assert can_resume(bedrock) is False


def test_the_first_finite_status_decides() -> None:
    assert can_resume(ForeignError("x", status=float("nan"), statusCode=401)) is False
    assert can_resume(ForeignError("x", status="401", statusCode=503)) is True
    assert can_resume(ForeignError("x", status=503, statusCode=401)) is True


def test_only_the_top_level_status_counts() -> None:
    wrapped = ForeignError("wrapper", cause=ForeignError("inner", status=401))
    assert can_resume(wrapped) is True


@pytest.mark.parametrize(
    "name",
    [
        "UnrecognizedClientException",
        "ExpiredTokenException",
        "InvalidSignatureException",
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
        "InvalidClientTokenId",
        "AccessDenied",
        "AccessDeniedException",
        "accessdeniedexception",
        "AuthFailure",
        "CredentialsError",
        "UnauthorizedException",
        "AuthenticationError",
        "PermissionDeniedError",
    ],
)
def test_auth_error_names_are_not_resumable(name: str) -> None:
    assert can_resume(ForeignError("refused", name=name)) is False


def test_a_class_named_like_an_auth_error_is_not_resumable() -> None:
    class AuthenticationError(Exception):
        pass

    assert can_resume(AuthenticationError("who are you")) is False


@pytest.mark.parametrize("name", ["MyAuthenticationErrorWrapper", "NotAccessDenied", "AuthFail"])
def test_auth_names_must_match_fully(name: str) -> None:
    assert can_resume(ForeignError("refused", name=name)) is True


@pytest.mark.parametrize(
    "text",
    ["Invalid API key provided", "invalid_api_key", "Incorrect API key", "No API key provided"],
)
def test_auth_messages_are_not_resumable(text: str) -> None:
    assert can_resume(ForeignError(text)) is False


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("read timed out"),
        ConnectionResetError("connection reset by peer"),
        ForeignError("circuit open", code="ERR_CIRCUIT_OPEN"),
        RuntimeError("something nobody recognizes"),
        ForeignError("no status", status=None),
    ],
)
def test_everything_else_is_resumable(error: BaseException) -> None:
    assert can_resume(error) is True


def test_a_provider_error_is_judged_by_its_status() -> None:
    assert can_resume(ProviderHTTPError("overloaded", status=503)) is True
    assert can_resume(ProviderHTTPError("unauthorized", status=401)) is False


def test_a_run_checkpoint_error_is_judged_by_its_cause() -> None:
    def wrap(cause: BaseException) -> RunCheckpointError:
        return RunCheckpointError("run failed", checkpoint=None, cause=cause)

    assert can_resume(wrap(ProviderHTTPError("unauthorized", status=401))) is False
    assert can_resume(wrap(ProviderHTTPError("overloaded", status=503))) is True


# ---------------------------------------------------------------------------------------------
# classify_failure_phase ("Failure phase classification"): used only when no bracket was open


@pytest.mark.parametrize(
    ("error", "phase"),
    [
        (ForeignError("breaker", code="ERR_CIRCUIT_OPEN"), "llm"),
        (ForeignError("boom", name="AnthropicError"), "llm"),
        (ForeignError("boom", name="OpenAIError"), "llm"),
        (ForeignError("boom", name="BedrockError"), "llm"),
        (RuntimeError("the LLM returned garbage"), "llm"),
        (RuntimeError("Provider unavailable"), "llm"),
        (RuntimeError("anthropic: overloaded"), "llm"),
        (RuntimeError("OPENAI quota"), "llm"),
        (RuntimeError("bedrock throttled"), "llm"),
        (ForeignError("boom", name="tool"), "tool"),
        (ForeignError("boom", name="Tool_Call"), "tool"),
        (ForeignError("boom", name="my-tool-failure"), "tool"),
        (RuntimeError("Tool lookup_order broke"), "tool"),
        (RuntimeError("max iteration budget reached"), "iteration"),
        (RuntimeError("ITERATIONS exhausted"), "iteration"),
        (RuntimeError("disk full"), "unknown"),
    ],
)
def test_failure_phase_classes(error: BaseException, phase: str) -> None:
    assert classify_failure_phase(error) == phase


def test_llm_words_win_over_tool_words() -> None:
    assert classify_failure_phase(RuntimeError("Tool asked the provider")) == "llm"


@pytest.mark.parametrize(
    ("text", "phase"),
    [
        ("providers are down", "unknown"),  # not the whole word
        ("llms", "unknown"),
        ("the tool broke", "unknown"),  # 'Tool' in a message is case-sensitive
        ("Toolbox missing", "unknown"),
        ("ToolError raised", "unknown"),
    ],
)
def test_words_are_whole_words(text: str, phase: str) -> None:
    assert classify_failure_phase(RuntimeError(text)) == phase


def test_a_tool_like_class_name_is_not_the_word_tool() -> None:
    class ToolError(Exception):
        pass

    assert classify_failure_phase(ToolError("broke")) == "unknown"


def test_word_boundaries_are_ascii_like_javascript() -> None:
    # JS \b treats é as a non-word character, so "éLLM" still contains the word LLM.
    assert classify_failure_phase(RuntimeError("réLLM failed")) == "llm"
    assert classify_failure_phase(RuntimeError("échecTool")) == "unknown"
    assert classify_failure_phase(RuntimeError("éTool")) == "tool"


# ---------------------------------------------------------------------------------------------
# the tree


@pytest.mark.parametrize(
    ("error_type", "code"),
    [
        (CheckpointFormatError, "ERR_CHECKPOINT_FORMAT"),
        (InvalidRunInputError, "ERR_INVALID_RUN_INPUT"),
        (RunInFlightError, "ERR_RUN_IN_FLIGHT"),
        (NoConversationError, "ERR_NO_CONVERSATION"),
        (ConversationMismatchError, "ERR_CONVERSATION_MISMATCH"),
        (RunCheckpointError, "ERR_RUN_CHECKPOINT"),
    ],
)
def test_every_error_is_an_agent_error_with_its_code(error_type: type, code: str) -> None:
    assert issubclass(error_type, AgentError)
    assert error_type.code == code


def test_a_format_error_is_a_type_error_and_an_input_error_a_value_error() -> None:
    assert issubclass(CheckpointFormatError, TypeError)
    assert issubclass(InvalidRunInputError, ValueError)


def test_run_checkpoint_error_carries_checkpoint_and_cause() -> None:
    cause = ProviderHTTPError("overloaded", status=503)
    error = RunCheckpointError("failed", checkpoint="cp", cause=cause)
    assert error.name == "RunCheckpointError"
    assert error.cause is cause and error.__cause__ is cause
    assert error.checkpoint == "cp"
