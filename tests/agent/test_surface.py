"""The public surface users code against (docs/api.md, section "agent"): pinned."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys

import pytest

import agent
from tests.conftest import ROOT

API_MD = ROOT / "docs" / "api.md"

PINNED_ALL = [
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
    "OUTCOME_UNKNOWN",
    "OpenAIChatProvider",
    "PendingRequest",
    "ProgressKind",
    "ProgressReport",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderResponseError",
    "ProviderTimeoutError",
    "REJECTED",
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


def api_import_block() -> list[str]:
    text = API_MD.read_text(encoding="utf-8")
    section = text.split("## agent", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"from agent import \((.*?)\)", section, re.S)
    assert match, "docs/api.md's agent section has no `from agent import (...)` block"
    return [name.strip() for name in match.group(1).replace("\n", " ").split(",") if name.strip()]


def test_all_is_pinned() -> None:
    assert len(set(agent.__all__)) == len(agent.__all__), "a name listed twice"
    assert sorted(agent.__all__) == PINNED_ALL


def test_every_name_in_all_exists() -> None:
    missing = [name for name in agent.__all__ if not hasattr(agent, name)]
    assert missing == []


def test_the_api_import_block_is_read_whole() -> None:
    names = api_import_block()
    assert names[0] == "Agent" and names[-1] == "fnv1a"
    assert len(names) == 38


@pytest.mark.parametrize("name", api_import_block())
def test_every_name_in_the_api_import_block_is_importable(name: str) -> None:
    module = importlib.import_module("agent")
    assert hasattr(module, name), f"`from agent import {name}` fails"
    assert name in agent.__all__


@pytest.mark.parametrize("name", ["OpenAIChatProvider", "AnthropicProvider"])
def test_the_real_providers_are_importable_from_agent(name: str) -> None:
    assert name in agent.__all__ and hasattr(agent, name)


def test_checkpoint_attributes_are_the_documented_snake_case_names() -> None:
    documented = {
        "version",
        "run_id",
        "history",
        "last_completed_iteration",
        "original_input",
        "checkpointed_at",
        "failure_point",
        "folded",
        "identity",
        "agent",
        "skill_cursor",
        "findings_ledger",
        "claim_verification",
        "turn_number",
        "evidence_recovery",
    }
    checkpoint = agent.AgentRunCheckpoint(
        run_id="run-1-1",
        history=[],
        last_completed_iteration=0,
        original_input={"message": "m"},
    )
    assert all(hasattr(checkpoint, name) for name in documented)
    for method in ("from_json", "from_dict", "to_dict", "to_json"):
        assert callable(getattr(agent.AgentRunCheckpoint, method))


def test_the_documented_value_fields_exist() -> None:
    assert {"content", "run_id", "turn_number", "iterations"} <= {
        f.name for f in dataclasses.fields(agent.AgentResult)
    }
    assert [f.name for f in dataclasses.fields(agent.AgentInput)][:5] == [
        "message",
        "continue_from",
        "identity",
        "message_from",
        "time",
    ]
    assert {"run_id", "tool_call_id", "turn_number", "identity"} <= {
        f.name for f in dataclasses.fields(agent.ToolContext)
    }


def test_the_agent_package_imports_no_celery_and_no_redis() -> None:
    probe = (
        "import sys, agent; "
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'redis')]; "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
