"""RunHooks (agent/hooks.py): one hooks object per run, whose check points see the reports at
fixed moments and stop the run by returning a value (RunStopped), not by raising."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

import pytest

from agent import (
    Agent,
    AgentError,
    AgentRunCheckpoint,
    Compaction,
    Decision,
    HookPoint,
    IterationJournal,
    JournaledCall,
    LLMRequest,
    LLMResponse,
    ModelCallPhase,
    ModelCallReport,
    ProgressKind,
    ProgressReport,
    ProviderTimeoutError,
    ResponseReport,
    RunCheckpointError,
    RunHooks,
    RunStopped,
    ScriptedProvider,
    Stop,
    TimeLayer,
    Tool,
    ToolCall,
    ToolCallPhase,
    ToolCallReport,
    ToolContext,
    can_resume,
    tool,
)
from agent.providers.scripted import Step

Event = tuple[str, Any]


class Recorder(RunHooks):
    """Logs every check point with its report, and stops at `stop_at` when `when` says so."""

    def __init__(
        self,
        log: list[Event],
        stop_at: str | None = None,
        when: Callable[[Any], bool] = lambda report: True,
        reason: object = None,
    ) -> None:
        self.log = log
        self.stop_at = stop_at
        self.when = when
        self.reason = reason if reason is not None else Stop(f"stop at {stop_at}")
        self.lock = threading.Lock()

    def _seen(self, point: str, report: Any) -> object:
        with self.lock:
            self.log.append((point, report))
        if point == self.stop_at and self.when(report):
            return self.reason
        return None

    def before_model_call(self, report: ModelCallReport) -> object:
        return self._seen("before_model_call", report)

    def after_model_call(self, report: ModelCallReport) -> object:
        return self._seen("after_model_call", report)

    def on_response(self, report: ResponseReport) -> object:
        return self._seen("on_response", report)

    def before_tool_call(self, report: ToolCallReport) -> object:
        return self._seen("before_tool_call", report)

    def after_tool_call(self, report: ToolCallReport) -> object:
        return self._seen("after_tool_call", report)

    def after_progress(self, report: ProgressReport) -> object:
        return self._seen("after_progress", report)


def lookup_tool(log: list[Event]) -> Tool:
    def execute(args: dict[str, Any]) -> str:
        log.append(("tool ran", args["order_id"]))
        return f"{args['order_id']}: shipped"

    return Tool(
        "lookup",
        "Look an order up.",
        {"type": "object", "properties": {"order_id": {"type": "string"}}},
        execute,
    )


def model_step(log: list[Event], response: LLMResponse) -> Callable[[LLMRequest], LLMResponse]:
    def step(request: LLMRequest) -> LLMResponse:
        log.append(("model called", request.iteration))
        return response

    return step


def lookups(*order_ids: str) -> LLMResponse:
    calls = [ToolCall(f"c-{oid}", "lookup", {"order_id": oid}) for oid in order_ids]
    return LLMResponse(content="looking", tool_calls=calls)


def two_rounds(log: list[Event], **options: Any) -> tuple[Agent, ScriptedProvider]:
    """Round 1 looks A and B up, round 2 answers."""
    steps: list[Step] = [
        model_step(log, lookups("A", "B")),
        model_step(log, LLMResponse(content="both shipped")),
    ]
    provider = ScriptedProvider(steps)
    agent = Agent(provider=provider, model="m", tools=[lookup_tool(log)], **options)
    return agent, provider


def points(log: list[Event]) -> list[str]:
    return [name for name, _ in log]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def stopped_by(run: Callable[[], object]) -> RunStopped:
    with pytest.raises(RunStopped) as stopped:
        run()
    return stopped.value


# ---------------------------------------------------------------------------------------------
# each check point, its report, its moment


def test_each_check_point_is_called_with_its_report_at_its_moment() -> None:
    log: list[Event] = []
    agent, _ = two_rounds(log)
    result = agent.run("where are A and B?", hooks=Recorder(log))
    assert result.content == "both shipped"
    assert points(log) == [
        "after_progress",  # seeded
        "before_model_call",
        "model called",
        "after_model_call",
        "on_response",
        "before_tool_call",
        "tool ran",
        "after_tool_call",
        "before_tool_call",
        "tool ran",
        "after_tool_call",
        "after_progress",  # round 1
        "before_model_call",
        "model called",
        "after_model_call",
    ]
    reports = [report for name, report in log if name not in ("model called", "tool ran")]
    seeded, started, finished, response = reports[:4]
    assert seeded.kind is ProgressKind.SEEDED and seeded.checkpoint.history == [
        user("where are A and B?")
    ]
    assert (started.phase, started.iteration, started.call_number) == (ModelCallPhase.STARTED, 1, 1)
    assert (finished.phase, finished.ok, finished.call_number) == (ModelCallPhase.FINISHED, True, 1)
    assert started.first_call and finished.first_call
    assert (response.iteration, response.history_length) == (1, 1)
    assert [c["id"] for c in response.message["toolCalls"]] == ["c-A", "c-B"]
    tool_reports = reports[4:8]
    assert [(r.phase, r.tool_call_id, r.index, r.ok) for r in tool_reports] == [
        (ToolCallPhase.STARTED, "c-A", 0, None),
        (ToolCallPhase.FINISHED, "c-A", 0, True),
        (ToolCallPhase.STARTED, "c-B", 1, None),
        (ToolCallPhase.FINISHED, "c-B", 1, True),
    ]
    assert tool_reports[1].content == "A: shipped"
    round_one = reports[8]
    assert round_one.kind is ProgressKind.ROUND and len(round_one.checkpoint.history) == 4
    assert round_one.checkpoint.last_completed_iteration == 1
    assert [(r.iteration, r.call_number, r.first_call) for r in reports[9:]] == [
        (2, 2, False),
        (2, 2, False),
    ]


def volatile_free(report: object) -> object:
    """A report without what differs between two runs (keys, checkpoint times, run ids)."""
    if isinstance(report, ToolCallReport):
        return (report.phase, report.tool, report.tool_call_id, report.ok, report.content)
    if isinstance(report, ProgressReport):
        wire = report.checkpoint.to_dict()
        del wire["runId"], wire["checkpointedAt"]
        return (report.kind, report.rebuildable, wire)
    return report


def test_the_hooks_object_and_the_keyword_hooks_see_the_same_reports() -> None:
    by_hooks: list[Event] = []
    agent, _ = two_rounds([])
    agent.run("where?", hooks=Recorder(by_hooks))

    by_keywords: list[Any] = []
    agent, _ = two_rounds([])
    agent.run(
        "where?",
        on_report=by_keywords.append,
        on_model_call=by_keywords.append,
        on_tool_call=by_keywords.append,
        on_response=by_keywords.append,
    )
    assert [volatile_free(r) for _, r in by_hooks] == [volatile_free(r) for r in by_keywords]


def test_a_journaled_iteration_makes_the_first_model_call_the_second_iterations() -> None:
    log: list[Event] = []
    message = {
        "role": "assistant",
        "content": "looking",
        "toolCalls": [{"id": "c-A", "name": "lookup", "args": {"order_id": "A"}}],
    }
    checkpoint = AgentRunCheckpoint(
        run_id="run-1-1",
        history=[user("where is A?")],
        last_completed_iteration=0,
        original_input={"message": "where is A?"},
    )
    journal = IterationJournal(
        1, message, {0: JournaledCall("c-A", "call-k", 1, content="A: shipped")}
    )
    provider = ScriptedProvider([LLMResponse(content="shipped")])
    agent = Agent(provider=provider, model="m", tools=[lookup_tool(log)])
    agent.resume_on_error(checkpoint, journal=journal, hooks=Recorder(log))
    model_reports = [r for _, r in log if isinstance(r, ModelCallReport)]
    assert [(r.iteration, r.call_number, r.first_call) for r in model_reports] == [
        (2, 1, True),
        (2, 1, True),
    ]
    assert "tool ran" not in points(log), "the journal held the call's outcome"


# ---------------------------------------------------------------------------------------------
# a stop at each check point


def test_a_stop_before_the_model_call_means_the_model_is_not_called() -> None:
    log: list[Event] = []
    agent, provider = two_rounds(log)
    reason = object()
    hooks = Recorder(log, "before_model_call", reason=reason)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert provider.requests == []
    assert points(log) == ["after_progress", "before_model_call"]
    assert stopped.reason is reason, "exactly what the check point returned"
    assert stopped.point is HookPoint.BEFORE_MODEL_CALL
    assert (stopped.phase, stopped.iteration) == ("llm", 1)
    assert stopped.checkpoint.history == [user("where?")]
    assert stopped.checkpoint.failure_point == {"iteration": 1, "phase": "llm", "stage": "call-llm"}
    assert stopped.checkpoint.last_completed_iteration == 0


def test_a_stop_before_a_later_model_call_keeps_the_rounds_done() -> None:
    log: list[Event] = []
    agent, provider = two_rounds(log)
    hooks = Recorder(log, "before_model_call", when=lambda r: not r.first_call)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert len(provider.requests) == 1
    assert stopped.iteration == 2 and stopped.checkpoint.last_completed_iteration == 1
    assert [m["role"] for m in stopped.checkpoint.history] == ["user", "assistant", "tool", "tool"]


def test_a_stop_after_the_model_call_drops_the_response() -> None:
    log: list[Event] = []
    agent, provider = two_rounds(log)
    stopped = stopped_by(lambda: agent.run("where?", hooks=Recorder(log, "after_model_call")))
    assert len(provider.requests) == 1
    assert points(log) == [
        "after_progress",
        "before_model_call",
        "model called",
        "after_model_call",
    ]
    assert stopped.point is HookPoint.AFTER_MODEL_CALL and stopped.phase == "llm"
    assert stopped.checkpoint.history == [user("where?")], "nothing of the response is kept"
    # The checkpoint resumes: the model is asked again for iteration 1.
    again: list[Event] = []
    fresh, _ = two_rounds(again)
    assert fresh.resume_on_error(stopped.checkpoint).content == "both shipped"
    assert again[0] == ("model called", 1)


def test_a_stop_after_a_failed_model_call_ends_with_run_stopped_not_the_failure() -> None:
    log: list[Event] = []
    agent = Agent(provider=ScriptedProvider([ProviderTimeoutError("slow")]), model="m")
    hooks = Recorder(log, "after_model_call", when=lambda r: r.ok is False)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert log[-1][1].error_type == "ProviderTimeoutError"
    assert stopped.point is HookPoint.AFTER_MODEL_CALL


def test_a_stop_at_the_response_runs_none_of_its_tools() -> None:
    log: list[Event] = []
    agent, _ = two_rounds(log)
    stopped = stopped_by(lambda: agent.run("where?", hooks=Recorder(log, "on_response")))
    assert points(log)[-1] == "on_response"
    assert "tool ran" not in points(log) and "before_tool_call" not in points(log)
    assert stopped.point is HookPoint.ON_RESPONSE
    assert stopped.checkpoint.failure_point == {"iteration": 1, "phase": "iteration"}
    assert stopped.checkpoint.history == [user("where?")]


def test_a_stop_before_a_tool_call_means_that_tool_and_the_later_ones_do_not_run() -> None:
    log: list[Event] = []
    agent, _ = two_rounds(log)
    hooks = Recorder(log, "before_tool_call", when=lambda r: r.index == 0)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert points(log)[-2:] == ["on_response", "before_tool_call"]
    assert "tool ran" not in points(log)
    assert stopped.point is HookPoint.BEFORE_TOOL_CALL
    assert stopped.checkpoint.failure_point == {"iteration": 1, "phase": "tool", "stage": "lookup"}
    assert stopped.checkpoint.history == [user("where?")]


def test_a_stop_after_a_tool_call_lets_it_finish_and_runs_no_later_call() -> None:
    log: list[Event] = []
    agent, _ = two_rounds(log)
    hooks = Recorder(log, "after_tool_call", when=lambda r: r.index == 0)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert [e for e in log if e[0] == "tool ran"] == [("tool ran", "A")]
    assert points(log)[-1] == "after_tool_call"
    assert stopped.point is HookPoint.AFTER_TOOL_CALL and stopped.phase == "tool"
    assert stopped.checkpoint.history == [user("where?")], "the round did not complete"


def test_a_stop_after_the_seeded_progress_calls_no_model() -> None:
    log: list[Event] = []
    agent, provider = two_rounds(log)
    stopped = stopped_by(lambda: agent.run("where?", hooks=Recorder(log, "after_progress")))
    assert provider.requests == [] and points(log) == ["after_progress"]
    assert stopped.point is HookPoint.AFTER_PROGRESS
    assert (stopped.phase, stopped.iteration) == ("iteration", 1)
    assert stopped.checkpoint.failure_point == {"iteration": 1, "phase": "iteration"}
    assert stopped.checkpoint.history == [user("where?")]


def test_a_stop_after_a_round_does_not_go_on() -> None:
    log: list[Event] = []
    agent, provider = two_rounds(log)
    hooks = Recorder(log, "after_progress", when=lambda r: r.kind is ProgressKind.ROUND)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert len(provider.requests) == 1 and points(log)[-1] == "after_progress"
    assert stopped.checkpoint.last_completed_iteration == 1
    assert len(stopped.checkpoint.history) == 4
    assert stopped.checkpoint.failure_point == {"iteration": 1, "phase": "iteration"}


def test_a_stop_after_a_fold_does_not_go_on() -> None:
    log: list[Event] = []
    provider = ScriptedProvider([lookups("A"), lookups("B"), LLMResponse(content="done")])
    agent = Agent(
        provider=provider,
        model="m",
        tools=[lookup_tool(log)],
        compaction=Compaction(max_messages=2, keep_last=1),
    )
    hooks = Recorder(log, "after_progress", when=lambda r: r.kind is ProgressKind.FOLDED)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert len(provider.requests) == 1, "the iteration that folded calls no model"
    assert stopped.checkpoint.folded and stopped.iteration == 2


def test_any_value_but_none_stops_false_included() -> None:
    log: list[Event] = []
    agent, provider = two_rounds(log)
    stopped = stopped_by(
        lambda: agent.run("where?", hooks=Recorder(log, "before_model_call", reason=False))
    )
    assert stopped.reason is False and provider.requests == []


def test_run_stopped_is_its_own_error_and_the_checkpoint_resumes() -> None:
    agent, _ = two_rounds([])

    class HostReason:
        def __repr__(self) -> str:
            return "HostReason(secret=sk-live-123)"

    reason = HostReason()
    hooks = Recorder([], "after_progress", when=lambda r: r.kind is ProgressKind.ROUND)
    hooks.reason = reason
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert isinstance(stopped, AgentError) and not isinstance(stopped, RunCheckpointError)
    assert stopped.code == "ERR_RUN_STOPPED"
    assert "after_progress" in str(stopped) and "HostReason" in str(stopped)
    assert "sk-live-123" not in str(stopped), "the reason's text is the host's, not the log's"
    assert stopped.__cause__ is None
    assert can_resume(stopped)
    # The instance is free again and holds the stopped run like a failed one.
    assert agent.checkpoint() is not None
    resumed = agent.resume_on_error(AgentRunCheckpoint.from_json(stopped.checkpoint.to_json()))
    assert resumed.content == "both shipped"


def test_a_stopped_run_cannot_be_followed_up() -> None:
    agent, _ = two_rounds([])
    stopped_by(lambda: agent.run("where?", hooks=Recorder([], "before_model_call")))
    with pytest.raises(AgentError, match="last-run-unfinished"):
        agent.follow_up("and?")


# ---------------------------------------------------------------------------------------------
# a check point that raises: today's RunCheckpointError


@pytest.mark.parametrize(
    ("point", "phase"),
    [
        ("before_model_call", "llm"),
        ("after_model_call", "llm"),
        ("before_tool_call", "tool"),
        ("after_tool_call", "tool"),
    ],
)
def test_a_check_point_that_raises_fails_the_run_with_its_cause(point: str, phase: str) -> None:
    problem = RuntimeError("lease store away")

    class Raising(RunHooks):
        pass

    def raise_it(self: RunHooks, report: object) -> object:
        raise problem

    setattr(Raising, point, raise_it)
    agent, _ = two_rounds([])
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("where?", hooks=Raising())
    assert failed.value.cause is problem
    assert failed.value.checkpoint.failure_point["phase"] == phase


def test_a_progress_check_point_that_raises_fails_the_run_as_on_progress_does() -> None:
    class Raising(RunHooks):
        def after_progress(self, report: ProgressReport) -> object:
            raise OSError("disk full")

    agent, provider = two_rounds([])
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("where?", hooks=Raising())
    assert isinstance(failed.value.cause, OSError) and provider.requests == []


# ---------------------------------------------------------------------------------------------
# parallel tools: tool check points from the calls' threads


def parallel_agent(log: list[Event], barrier: threading.Barrier) -> Agent:
    def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        barrier.wait(timeout=5)  # all three run at once, or this times out
        log.append(("tool ran", args["order_id"]))
        return f"{args['order_id']}: shipped"

    parallel = Tool("lookup", "Look an order up.", {"type": "object"}, execute)
    steps: list[Step] = [lookups("A", "B", "C"), LLMResponse(content="all shipped")]
    return Agent(provider=ScriptedProvider(steps), model="m", tools=[parallel], parallel_tools=True)


class ThreadRecorder(Recorder):
    def _seen(self, point: str, report: Any) -> object:
        with self.lock:
            self.log.append((point, (report, threading.current_thread().name)))
        if point == self.stop_at and self.when(report):
            return self.reason
        return None


def test_with_parallel_tools_the_tool_check_points_come_from_the_calls_threads() -> None:
    log: list[Event] = []
    result = parallel_agent(log, threading.Barrier(3)).run("where?", hooks=ThreadRecorder(log))
    assert result.content == "all shipped"
    main = threading.current_thread().name
    for name, seen in log:
        if name == "tool ran":
            continue
        _, thread = seen
        if name in ("before_tool_call", "after_tool_call"):
            assert thread.startswith("agent-tools"), name
        else:
            assert thread == main, name
    tools = sorted((seen[0].index, seen[0].phase) for name, seen in log if "tool_call" in name)
    assert tools == [
        (i, p) for i in range(3) for p in (ToolCallPhase.FINISHED, ToolCallPhase.STARTED)
    ]


def test_a_parallel_tool_check_point_sees_the_callers_context() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    request_id.set("req-7")
    seen: list[str] = []

    class Hooks(RunHooks):
        def before_tool_call(self, report: ToolCallReport) -> object:
            seen.append(request_id.get("unset"))
            return None

    parallel_agent([], threading.Barrier(3)).run("where?", hooks=Hooks())
    assert seen == ["req-7"] * 3


def test_a_stop_in_one_parallel_call_lets_the_others_finish() -> None:
    log: list[Event] = []
    # Two calls meet at the barrier; the stopped one never reaches it.
    agent = parallel_agent(log, threading.Barrier(2))
    hooks = ThreadRecorder(log, "before_tool_call", when=lambda r: r.index == 1)
    stopped = stopped_by(lambda: agent.run("where?", hooks=hooks))
    assert sorted(order for name, order in log if name == "tool ran") == ["A", "C"]
    finished = sorted(seen[0].index for name, seen in log if name == "after_tool_call")
    assert finished == [0, 2], "the calls already running finished and reported"
    assert stopped.point is HookPoint.BEFORE_TOOL_CALL and stopped.phase == "tool"
    assert stopped.checkpoint.history == [user("where?")]


@pytest.mark.parametrize("stop_first", [False, True])
def test_in_parallel_the_first_ending_in_the_models_order_ends_the_run(stop_first: bool) -> None:
    stop_index, raise_index = (0, 2) if stop_first else (2, 0)

    class Hooks(RunHooks):
        def after_tool_call(self, report: ToolCallReport) -> object:
            if report.index == raise_index:
                raise RuntimeError("journal write failed")
            return Stop("draining") if report.index == stop_index else None

    expected = RunStopped if stop_first else RunCheckpointError
    with pytest.raises(expected) as ended:
        parallel_agent([], threading.Barrier(3)).run("where?", hooks=Hooks())
    if isinstance(ended.value, RunStopped):
        assert ended.value.reason == Stop("draining")
    else:
        assert isinstance(ended.value, RunCheckpointError)
        assert str(ended.value.cause) == "journal write failed"


# ---------------------------------------------------------------------------------------------
# the doors


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: shipped"


@tool(approval=True)
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"{order_id}: refunded"


def test_every_door_takes_hooks() -> None:
    log: list[Event] = []
    steps: list[Step] = [
        LLMResponse(content="one"),
        LLMResponse(content="two"),
        ProviderTimeoutError("slow"),
        LLMResponse(content="three"),
        LLMResponse(tool_calls=[ToolCall("r1", "refund", {"order_id": "A"})]),
        LLMResponse(content="refunded"),
    ]
    agent = Agent(provider=ScriptedProvider(steps), model="m", tools=[lookup, refund])
    hooks = Recorder(log)
    agent.run("one", hooks=hooks)
    agent.follow_up("two", hooks=hooks)
    with pytest.raises(RunCheckpointError) as failed:
        agent.follow_up("three")
    agent.resume_on_error(failed.value.checkpoint, hooks=hooks)
    paused = agent.follow_up("refund A")
    assert paused.pause is not None
    request_id = paused.pause.pending[0].request_id
    log.clear()
    assert agent.resume({request_id: Decision.approve()}, hooks=hooks).content == "refunded"
    assert points(log)[:3] == ["after_progress", "before_tool_call", "after_tool_call"]


def test_hooks_and_a_keyword_hook_together_are_refused_at_every_door() -> None:
    agent, provider = two_rounds([])
    hooks = RunHooks()
    calls: list[Callable[[], object]] = [
        lambda: agent.run("x", hooks=hooks, on_report=print),
        lambda: agent.follow_up("x", hooks=hooks, on_tool_call=print),
        lambda: agent.resume_on_error(b"{}", hooks=hooks, on_model_call=print),
        lambda: agent.resume({}, hooks=hooks, on_progress=print, on_response=print),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="not both"):
            call()
    with pytest.raises(TypeError, match=r"on_progress=, on_response="):
        calls[3]()
    assert provider.requests == []
    assert agent.run("where?").content == "both shipped", "nothing was claimed"


def test_hooks_must_be_a_run_hooks() -> None:
    agent, _ = two_rounds([])
    with pytest.raises(TypeError, match="RunHooks"):
        agent.run("x", hooks=print)  # type: ignore[arg-type]


def test_a_keyword_hook_that_returns_a_value_does_not_stop_the_run() -> None:
    seen: list[object] = []

    def keeps_and_returns(report: object) -> object:
        seen.append(report)
        return Stop("ignored: keyword hooks never stop by returning")

    agent, _ = two_rounds([])
    result = agent.run(
        "where?",
        on_progress=keeps_and_returns,
        on_report=keeps_and_returns,
        on_model_call=keeps_and_returns,
        on_tool_call=keeps_and_returns,
        on_response=keeps_and_returns,
    )
    assert result.content == "both shipped" and len(seen) == 13


def test_a_plain_run_hooks_changes_nothing() -> None:
    plain, plain_provider = two_rounds([])
    hooked, hooked_provider = two_rounds([])
    assert plain.run("where?").content == hooked.run("where?", hooks=RunHooks()).content
    assert [r.to_dict() for r in plain_provider.requests] == [
        r.to_dict() for r in hooked_provider.requests
    ]


# ---------------------------------------------------------------------------------------------
# the new report fields


def test_a_seed_without_a_time_layer_is_rebuildable_and_a_round_never_is() -> None:
    log: list[Event] = []
    agent, _ = two_rounds(log)
    agent.run("where?", hooks=Recorder(log))
    progress = [r for name, r in log if name == "after_progress"]
    assert [(r.kind, r.rebuildable) for r in progress] == [
        (ProgressKind.SEEDED, True),
        (ProgressKind.ROUND, False),
    ]


def test_a_seed_that_fixed_the_clock_is_not_rebuildable() -> None:
    log: list[Event] = []
    agent, _ = two_rounds(log, time=TimeLayer(zone="Europe/Paris"))
    agent.run("where?", hooks=Recorder(log))
    seeded = log[0][1]
    assert seeded.kind is ProgressKind.SEEDED and seeded.rebuildable is False
    assert [row["kind"] for row in seeded.checkpoint.findings_ledger] == ["clock"]


def test_a_resume_that_keeps_the_turns_clock_is_rebuildable_one_that_fixes_it_is_not() -> None:
    log: list[Event] = []
    agent = Agent(
        provider=ScriptedProvider([ProviderTimeoutError("slow"), LLMResponse(content="ok")]),
        model="m",
        time=TimeLayer(zone="Europe/Paris"),
    )
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("hello")
    agent.resume_on_error(failed.value.checkpoint, hooks=Recorder(log))
    assert (log[0][1].kind, log[0][1].rebuildable) == (ProgressKind.SEEDED, True)

    # A checkpoint of the same turn without a clock: the resume fixes one now.
    no_clock = AgentRunCheckpoint(
        run_id="run-1-1",
        history=[user("hello")],
        last_completed_iteration=0,
        original_input={"message": "hello"},
    )
    log.clear()
    again = Agent(
        provider=ScriptedProvider([LLMResponse(content="ok")]),
        model="m",
        time=TimeLayer(zone="Europe/Paris"),
    )
    again.resume_on_error(no_clock, hooks=Recorder(log))
    assert (log[0][1].kind, log[0][1].rebuildable) == (ProgressKind.SEEDED, False)


def test_the_new_fields_have_defaults_so_old_constructors_still_work() -> None:
    checkpoint = AgentRunCheckpoint(
        run_id="run-1-1", history=[], last_completed_iteration=0, original_input={"message": "m"}
    )
    assert ProgressReport(ProgressKind.SEEDED, checkpoint).rebuildable is False
    report = ModelCallReport(ModelCallPhase.STARTED, "m", 3)
    assert report.call_number == 1 and report.first_call
    assert not ModelCallReport(ModelCallPhase.STARTED, "m", 3, call_number=2).first_call


def test_the_hook_points_are_named_as_the_methods() -> None:
    for point in HookPoint:
        assert callable(getattr(RunHooks, point.value))
    assert [str(p) for p in HookPoint] == [
        "before_model_call",
        "after_model_call",
        "on_response",
        "before_tool_call",
        "after_tool_call",
        "after_progress",
    ]
