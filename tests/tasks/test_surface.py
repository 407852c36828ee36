"""The job system's public surface (docs/api.md, section "tasks"): pinned, like `agent`'s.
Users import what they need from `tasks`; nothing makes them reach into tasks.queue.context."""

from __future__ import annotations

import re
import subprocess
import sys

import tasks
from tests.conftest import ROOT

PINNED_ALL = [
    "ActionConflict",
    "IdentityHint",
    "InvalidTurnRequest",
    "PendingAction",
    "Reason",
    "TurnCancelled",
    "TurnDeadLettered",
    "TurnEvent",
    "TurnState",
    "TurnStatus",
    "answer_question",
    "app",
    "approve_action",
    "cancel_conversation",
    "cancel_turn",
    "iter_events",
    "load_conversation",
    "reject_action",
    "resume_turn",
    "run_turn",
    "turn_status",
]


def documented_names() -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("\n## tasks", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^from tasks import (.+)$", section, re.M)
    assert match, "docs/api.md's tasks section has no `from tasks import ...` line"
    return [name.strip() for name in match.group(1).split(",")]


def test_all_is_pinned() -> None:
    assert len(set(tasks.__all__)) == len(tasks.__all__), "a name listed twice"
    assert sorted(tasks.__all__) == PINNED_ALL


def test_every_documented_name_is_exported() -> None:
    assert set(documented_names()) <= set(tasks.__all__)
    for name in tasks.__all__:
        assert getattr(tasks, name) is not None


def test_importing_tasks_opens_no_connection() -> None:
    # Clients import tasks in web processes: no Redis may be needed until a turn is submitted.
    probe = (
        "import socket\n"
        "def refuse(*a, **k): raise AssertionError('connected at import')\n"
        "socket.socket.connect = refuse\n"
        "import tasks\n"
        "print('ok')\n"
    )
    env = {"REDIS_URL": "redis://127.0.0.1:1/0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_turn_status_names_what_a_waiting_turn_waits_for() -> None:
    # PLATFORM.md section 4: TurnStatus.waiting_for ("budget", "tenant_tokens"; ours: "retry").
    import dataclasses

    from tasks import TurnStatus

    assert "waiting_for" in {f.name for f in dataclasses.fields(TurnStatus)}
