"""The job system's side of a run: the check points the runtime calls (agent.RunHooks), as one
attempt of a turn keeps them.

    before_model_call  the turn still ours? (a lease renewal, except when a write that checked
                       the lease has just been made: the claim before the attempt's first
                       call, the round's progress before the next); a worker shutting down
                       hands the turn over here, before it pays for another call; a spent
                       budget or tenant cap makes the turn wait here (tasks/budgets/meter.py)
    (on_token)         the answer text as it streams, coalesced into token.delta events
                       (tasks/turn/tokens.py); not a check point: the door's `on_token`
    after_model_call   the call's reservation settled with its reported usage; its last text
                       written (the writer's final flush), before its response is used; a
                       turn no longer ours stops here
    on_response        the response is journaled with its first call's start (no round trip)
    before_tool_call   the call's start journaled, with its `tool.started` event; a turn no
                       longer ours does not run the tool; shutting down hands the turn over
    after_tool_call    the call's outcome journaled, with its `tool.finished` event; the last
                       call of a response leaves its event to the round's progress, written
                       next (below), since that frame holds the outcome and drops the journal
    after_progress     a frame of the progress written before the loop goes on (persist, then
                       proceed); a seed a fresh start would rebuild is not written

Folding the last outcome into the progress write changes nothing a crash can see: until
that write, the run has not gone on (no model call has seen the result), so a crash there is
a crash during the call, for the journal as before (an idempotent call runs again with its
key, an unsafe one is not run twice). Should the run stop before a progress write instead,
the outcome is journaled as usual first (`flush`, before any outcome of the attempt).

A check point steers the run by what it returns (agent/hooks.py): None goes on; LeaseLost
(this delivery no longer holds the turn) or HandedOver (the worker is shutting down) stops the
run with RunStopped, which tasks/turn/outcomes.py reads. Writes wait for a store that refuses
them for a while (tasks/turn/ending.py, `patiently`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson

from agent import (
    AgentRunCheckpoint,
    ModelCallReport,
    ProgressKind,
    ProgressReport,
    ResponseReport,
    RunHooks,
    ToolCallPhase,
    ToolCallReport,
)
from tasks.budgets.meter import CallMeter
from tasks.core.errors import HandedOver, JobError, LeaseLost
from tasks.core.namespaces import owner_of_namespace
from tasks.core.schema import Event
from tasks.queue.context import JobContext
from tasks.queue.results import RUNNING
from tasks.store.journal import call_fields, response_fields
from tasks.store.progress import FrameWriter
from tasks.store.records import TurnRecord
from tasks.telemetry.tracing import AttemptTrace
from tasks.turn import ending
from tasks.turn.tokens import TokenWriter

_TOOL_EVENTS = {
    ToolCallPhase.STARTED: Event.TOOL_STARTED,
    ToolCallPhase.FINISHED: Event.TOOL_FINISHED,
}
# A write that checked the lease this recently makes a renewal before the next model call
# redundant: nothing has run in between that could have let the turn go.
LEASE_CHECKED_FRESH_S = 0.25


class TurnCheckpoints(RunHooks):
    """One attempt's check points, and what they keep: the progress frames, the iteration in
    flight, the journaled response, the attempt's spans and its RUNNING mirror."""

    def __init__(self, ctx: JobContext, record: TurnRecord, token: str) -> None:
        self.ctx = ctx
        self.record = record
        self.turn_id = record.turn_id
        self.namespace = record.namespace
        self.token = token
        self.attempt = record.attempt
        self.last_checkpoint: AgentRunCheckpoint | None = None
        self.frames = FrameWriter(None)
        # The turn's iteration in flight, across attempts: each completed round starts the next.
        self.iteration = record.iteration or 1
        self.journal_lock = threading.Lock()
        self.unwritten_response: dict[str, bytes] | None = None
        self.report_lock = threading.Lock()
        self.outcome_decided = False
        self.reported_iteration = 0
        # The first delivery of a turn finds no earlier state mirrored in Celery's backend;
        # a later one (after a retry, a pause, a crash) finds WAITING or PAUSED there.
        self.mirror_stale = record.attempt > 1 or record.deliveries > 1
        # Calls of the fresh response still to finish, and the last call's outcome left to
        # the round's progress write (its journal fields and its event's data).
        self.open_calls = 0
        self.unwritten_outcome: tuple[dict[str, bytes], bytes] | None = None
        # When a write last found the lease this delivery's (monotonic); the claim did.
        self.lease_checked_at = time.monotonic()
        # The attempt's spans (tasks/telemetry/tracing.py); None when not tracing.
        self.trace: AttemptTrace | None = None
        # The streamed text: the door's on_token is `tokens.add`.
        self.tokens = TokenWriter(self._write_tokens, ctx.settings.token_flush_ms)
        # Budgets, tenant caps and the attempt's token usage (tasks/budgets/meter.py).
        self.meter = CallMeter(
            ctx.settings,
            ctx.ledger,
            turn_id=record.turn_id,
            token=token,
            tenant=owner_of_namespace(record.namespace)[0],
            write=self._write,
        )

    def start_from(self, checkpoint: AgentRunCheckpoint | None) -> None:
        """The progress the run starts from: later frames hold what changed since."""
        self.last_checkpoint = checkpoint
        self.frames = FrameWriter(checkpoint)

    def _write(self, write: Any, *args: Any, **kwargs: Any) -> Any:
        return ending.patiently(self.ctx, self.record, write, *args, **kwargs)

    def _renew(self, **progress: Any) -> bool:
        lease_ttl_s = self.ctx.settings.lease_ttl_s
        records = self.ctx.records
        renewed = bool(
            self._write(
                records.renew, self.turn_id, self.namespace, self.token, lease_ttl_s, **progress
            )
        )
        if renewed:
            self.lease_checked_at = time.monotonic()
        return renewed

    def _lease_checked_just_now(self) -> bool:
        return time.monotonic() - self.lease_checked_at < LEASE_CHECKED_FRESH_S

    # -- the check points ----------------------------------------------------------------------

    def before_model_call(self, report: ModelCallReport) -> JobError | None:
        if self.ctx.leases.draining:
            return HandedOver(self.turn_id)
        if not self._lease_checked_just_now() and not self._renew():
            return LeaseLost(self.turn_id)
        if self.meter.metered:  # a budget or a tenant cap may hold the call back
            held = self.meter.before(report)
            if held is not None:
                return held
        if self.trace is not None:  # past the check point: the call is made
            self.trace.model_call(report)
        return None

    def after_model_call(self, report: ModelCallReport) -> LeaseLost | None:
        if self.trace is not None:
            self.trace.model_call(report)
        self.meter.after(report)
        if not self._write(self.tokens.flush):
            return LeaseLost(self.turn_id)
        return None

    def on_response(self, report: ResponseReport) -> None:
        with self.journal_lock:
            self.unwritten_response = response_fields(report)
            self.open_calls = len(report.message.get("toolCalls") or ())
        if self.trace is not None:
            self.trace.response(report)
        return None

    def before_tool_call(self, report: ToolCallReport) -> LeaseLost | None:
        if self.ctx.leases.draining:
            return HandedOver(self.turn_id)
        if not self._journal(report):
            return LeaseLost(self.turn_id)
        if self.trace is not None:  # the start is journaled: the call runs
            self.trace.tool_call(report)
        return None

    def after_tool_call(self, report: ToolCallReport) -> LeaseLost | None:
        if self.trace is not None:
            self.trace.tool_call(report)
        with self.journal_lock:
            if self.open_calls > 0:
                self.open_calls -= 1
                if self.open_calls == 0 and self.unwritten_response is None:
                    # The response's last call: its round's progress comes next.
                    self.unwritten_outcome = (call_fields(report), _tool_event_data(report))
                    return None
        return None if self._journal(report) else LeaseLost(self.turn_id)

    def after_progress(self, report: ProgressReport) -> LeaseLost | None:
        self.last_checkpoint = report.checkpoint
        ends_iteration = report.kind is ProgressKind.ROUND
        if report.rebuildable or not ends_iteration:
            if not self.flush():
                return LeaseLost(self.turn_id)
            if report.rebuildable:
                return None
        if ends_iteration:
            self.iteration += 1
        frame = self.frames.frame(report.checkpoint)
        with self.journal_lock:
            outcome, self.unwritten_outcome = self.unwritten_outcome, None
        finished = (outcome[1],) if outcome is not None else ()
        if not self._renew(
            frame=frame, iteration=self.iteration, ends_iteration=ends_iteration, finished=finished
        ):
            return LeaseLost(self.turn_id)
        if ends_iteration and self.mirror_stale:
            self.report_running()
        return None

    # -- what they keep ------------------------------------------------------------------------

    def _journal(self, report: ToolCallReport) -> bool:
        """A tool call's start (its key and attempt) or outcome in the journal, with its event
        in the turn's stream, in one step; the response it belongs to goes with the first
        start. Held while writing: a parallel call starts only once the response is in."""
        with self.journal_lock:
            fields = {**(self.unwritten_response or {}), **call_fields(report)}
            written = self._write_journal(fields, report.phase, _tool_event_data(report))
            if written:
                self.unwritten_response = None
        return written

    def _write_journal(self, fields: dict[str, bytes], phase: ToolCallPhase, data: bytes) -> bool:
        written = bool(
            self._write(
                self.ctx.records.write_journal,
                self.turn_id,
                self.namespace,
                self.token,
                fields,
                event_type=_TOOL_EVENTS[phase],
                event_data=data,
            )
        )
        if written:
            self.lease_checked_at = time.monotonic()
        return written

    def _write_tokens(self, text: str) -> bool:
        """One token.delta (the TokenWriter's write): like any write it checks the lease."""
        check_ms = self.ctx.settings.token_ttl_s * 1000
        records = self.ctx.records
        written = records.write_tokens(
            self.turn_id, self.namespace, self.token, text, check_ms=check_ms
        )
        if written:
            self.lease_checked_at = time.monotonic()
        return written

    def flush(self) -> bool:
        """Journal the outcome left to a progress write that did not come (the run stopped
        first, or went on without a round's frame); False when the turn is no longer ours."""
        with self.journal_lock:
            outcome, self.unwritten_outcome = self.unwritten_outcome, None
            if outcome is None:
                return True
            return self._write_journal(outcome[0], ToolCallPhase.FINISHED, outcome[1])

    def take_unwritten(self) -> dict[str, bytes]:
        """The response journaled with no call started yet (the run stopped first)."""
        with self.journal_lock:
            unwritten, self.unwritten_response = self.unwritten_response, None
        return unwritten or {}

    def report_running(self) -> None:
        """Mirror `running` to Celery's result backend. Called by the lease keeper's first
        renewal (a quarter lease in), and after each persisted round of a delivery that finds
        an earlier WAITING or PAUSED there; not at the claim, nor after the rounds of a first
        delivery (PENDING until then): a result write costs a short turn a fifth of its
        throughput, and nobody can see a state that lasts less than that. Never once the
        outcome is decided, so it cannot overwrite the final result."""
        with self.report_lock:
            if self.outcome_decided or self.reported_iteration == self.iteration:
                return
            self.reported_iteration = self.iteration
            info = {"state": "running", "attempt": self.attempt, "iteration": self.iteration}
            ending.mirror_state(self.ctx, self.record, RUNNING, info)

    def decided(self) -> None:
        """The outcome is decided: no RUNNING mirror from now on."""
        with self.report_lock:
            self.outcome_decided = True


def _tool_event_data(report: ToolCallReport) -> bytes:
    """The data of a tool call's `tool.started` or `tool.finished` event."""
    data: dict[str, Any] = {"tool": report.tool, "toolCallId": report.tool_call_id}
    if report.phase is ToolCallPhase.FINISHED:
        data["ok"] = bool(report.ok)
    return orjson.dumps(data)
