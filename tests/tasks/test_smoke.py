from __future__ import annotations

from typing import Any

from tasks import load_conversation, run_turn


def test_a_turn_runs_on_a_real_worker(jobs: Any) -> None:
    result = run_turn.delay(agent="demo", conversation_id="c-1", message="hello rounds:1")
    reply = result.get(timeout=30)
    assert reply["content"] == "Done: hello rounds:1"
    assert reply["turnNumber"] == 1 and reply["attempts"] == 1
    stored = load_conversation("c-1")
    assert stored is not None and len(stored.history) == 4
