"""The soak's own checks on hand-made evidence (bench/soak_checks.py), so a check that cannot
fail would show here. Collected by `./dev test` (pyproject's testpaths); the soak itself runs as
tests/tasks/test_soak.py, a subprocess."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.soak_checks import (
    PlannedTurn,
    Start,
    Turn,
    check_dead_letters,
    check_histories,
    check_side_effects,
    expected_history,
    logged_ends,
)


def turn(number: int, state: str = "succeeded", rounds: int = 1, **record: str) -> Turn:
    plan = PlannedTurn(number, "c000", rounds, refused=False)
    return Turn(plan, f"task-{number}", {"state": state, **record})


def test_a_side_effect_repeated_outside_any_chaos_event_fails() -> None:
    turns = [turn(1, rounds=2)]
    effects = {(1, 1): 1, (1, 2): 2}
    finding, repeats = check_side_effects(turns, effects, {})
    assert repeats.total == 1
    assert any("ran 2 times" in p for p in finding.problems)


def test_a_side_effect_repeated_once_per_event_it_was_in_flight_at_passes() -> None:
    turns = [turn(1, rounds=2)]
    effects = {(1, 1): 1, (1, 2): 2}
    finding, _ = check_side_effects(turns, effects, {(1, 2): ["kill w1"]})
    assert finding.problems == []
    finding, _ = check_side_effects(turns, {**effects, (1, 2): 3}, {(1, 2): ["kill w1"]})
    assert finding.problems, "three runs with one kill in flight must fail"


def test_a_round_of_a_succeeded_turn_that_never_ran_fails() -> None:
    finding, _ = check_side_effects([turn(1, rounds=2)], {(1, 1): 1}, {})
    assert any("round 2 never ran" in p for p in finding.problems)


def stored(history: list[dict[str, Any]]) -> Any:
    return SimpleNamespace(history=history)


def test_histories_must_hold_each_succeeded_turn_once_in_order() -> None:
    first, second = turn(1), turn(2, rounds=2)
    good = expected_history([first.plan, second.plan])
    assert check_histories([first, second], lambda *_: stored(good))[0].problems == []
    twice = good + expected_history([second.plan])
    assert check_histories([first, second], lambda *_: stored(twice))[0].problems
    swapped = expected_history([second.plan, first.plan])
    assert check_histories([first, second], lambda *_: stored(swapped))[0].problems
    dead = turn(2, state="dead_lettered", rounds=2)
    assert check_histories([first, dead], lambda *_: stored(good))[0].problems


def test_outcome_unknown_is_accepted_only_for_an_unsafe_round_in_flight() -> None:
    unsafe = turn(3, rounds=2)  # every third turn's tool is unsafe
    said = expected_history([unsafe.plan], unknown=[(3, 2)])
    finding, unknown = check_histories([unsafe], lambda *_: stored(said), [(3, 2)])
    assert (finding.problems, unknown) == ([], {(3, 2)})
    finding, _ = check_histories([unsafe], lambda *_: stored(said), [])
    assert finding.problems, "[outcome unknown] for a round that was not in flight must fail"


def test_a_call_started_again_must_keep_its_key_and_never_be_unsafe() -> None:
    turns = [turn(1), turn(3)]
    effects = {(1, 1): 2, (3, 1): 2}
    in_flight = {(1, 1): ["kill w1"], (3, 1): ["kill w1"]}
    same = {(1, 1): [Start("k", 1), Start("k", 2)]}
    finding, repeats = check_side_effects(turns, effects, in_flight, same)
    assert finding.problems == [] and repeats.same_key == 1
    other_key = {(1, 1): [Start("k", 1), Start("j", 2)]}
    assert check_side_effects(turns, {(1, 1): 2}, in_flight, other_key)[0].problems
    after_outcome = {(1, 1): [Start("k", 1, returned=True, journaled=True), Start("k", 2)]}
    finding, repeats = check_side_effects(turns, {(1, 1): 2}, in_flight, after_outcome)
    assert finding.problems and repeats.after_outcome == 1
    # killed after its tool returned but before its outcome was journaled: interrupted
    after_return = {(1, 1): [Start("k", 1, returned=True), Start("k", 2)]}
    finding, repeats = check_side_effects(turns, effects, in_flight, after_return)
    assert finding.problems == [] and repeats.after_return == 1
    unsafe = {(3, 1): [Start("u", 1), Start("u", 2)]}
    finding, repeats = check_side_effects(turns, effects, in_flight, unsafe)
    assert any("unsafe" in p for p in finding.problems) and repeats.unsafe == 1


def test_an_exhausted_turn_whose_last_error_is_not_a_gateway_fault_fails() -> None:
    dead = turn(
        1,
        state="dead_lettered",
        attempt="5",
        reason="max_attempts",
        dlq_id="dl-task-1",
        last_error="ConnectionError: Error 111 connecting to 127.0.0.1:6379.",
    )
    checkpoint = {"version": 1, "runId": "run-1", "history": [], "originalInput": {"message": ""}}
    entry = {
        "id": "dl-task-1",
        "taskId": "task-1",
        "reason": "max_attempts",
        "attempts": 5,
        "errorType": "ProviderHTTPError",
        "error": "gateway [redacted-url] answered HTTP 503",
        "checkpoint": checkpoint,
    }
    problems = check_dead_letters([dead], [entry], max_attempts=5).problems
    assert any("last_error is not a 503/429" in p for p in problems)
    assert check_dead_letters([dead], [], max_attempts=5).problems


def test_logged_ends_counts_each_turn_s_endings() -> None:
    task_id = "0b1c2d3e-0000-4000-8000-000000000001"
    logs = [
        f"Task tasks.run_turn[{task_id}] succeeded in 0.1s: {{}}",
        f"Task tasks.resume_turn[{task_id}] succeeded in 0.2s: {{}}",
    ]
    assert logged_ends(logs)[task_id]["succeeded"] == 2
