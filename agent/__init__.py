"""agentjobs' pure agent runtime: agents whose conversations are AgentRunCheckpoint v1 JSON.

No Celery and no Redis here: everything in this package runs in a plain script.
"""

from agent.checkpoint import AgentRunCheckpoint, validate_checkpoint
from agent.clock import RunTime, TimeLayer
from agent.errors import (
    AgentError,
    CheckpointFormatError,
    ConversationMismatchError,
    InvalidRunInputError,
    MessageDeniedError,
    NoConversationError,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderResponseError,
    ProviderTimeoutError,
    RunCheckpointError,
    RunInFlightError,
    RunPausedError,
    ToolAbort,
    can_resume,
    classify_failure_phase,
)
from agent.folding import Compaction, fnv1a, folded_messages, folded_span_for, is_compacted_summary
from agent.hooks import (
    HookPoint,
    ModelCallPhase,
    ModelCallReport,
    ProgressKind,
    ProgressReport,
    RunHooks,
    RunStopped,
    Stop,
    TokenDelta,
    ToolCallPhase,
    ToolCallReport,
)
from agent.identity import encode_namespace
from agent.journal import (
    OUTCOME_UNKNOWN,
    IterationJournal,
    JournaledCall,
    PendingRequest,
    RequestKind,
    ResponseReport,
    ToolEffect,
)
from agent.messages import LLMProvider, LLMRequest, LLMResponse, StreamChunk, ToolCall
from agent.middleware import Deny, InputContext
from agent.pauses import REJECTED, Decision, RunPause, ask_user
from agent.providers.anthropic import AnthropicProvider
from agent.providers.echo import EchoProvider
from agent.providers.openai import OpenAIChatProvider
from agent.providers.scripted import ScriptedProvider, ScriptExhaustedError
from agent.runtime import Agent, AgentInput, AgentResult
from agent.skills import SkillGraph
from agent.tools import Tool, ToolContext, tool

__all__ = [
    "OUTCOME_UNKNOWN",
    "REJECTED",
    "Agent",
    "AgentError",
    "AgentInput",
    "AgentResult",
    "AgentRunCheckpoint",
    "AnthropicProvider",
    "CheckpointFormatError",
    "Compaction",
    "ConversationMismatchError",
    "Decision",
    "Deny",
    "EchoProvider",
    "HookPoint",
    "InputContext",
    "InvalidRunInputError",
    "IterationJournal",
    "JournaledCall",
    "LLMProvider",
    "LLMRequest",
    "LLMResponse",
    "MessageDeniedError",
    "ModelCallPhase",
    "ModelCallReport",
    "NoConversationError",
    "OpenAIChatProvider",
    "PendingRequest",
    "ProgressKind",
    "ProgressReport",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderResponseError",
    "ProviderTimeoutError",
    "RequestKind",
    "ResponseReport",
    "RunCheckpointError",
    "RunHooks",
    "RunInFlightError",
    "RunPause",
    "RunPausedError",
    "RunStopped",
    "RunTime",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "SkillGraph",
    "Stop",
    "StreamChunk",
    "TimeLayer",
    "TokenDelta",
    "Tool",
    "ToolAbort",
    "ToolCall",
    "ToolCallPhase",
    "ToolCallReport",
    "ToolContext",
    "ToolEffect",
    "ask_user",
    "can_resume",
    "classify_failure_phase",
    "encode_namespace",
    "fnv1a",
    "folded_messages",
    "folded_span_for",
    "is_compacted_summary",
    "tool",
    "validate_checkpoint",
]
