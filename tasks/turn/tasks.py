"""run_turn and resume_turn: the lifecycle of one turn on a worker.

    run_turn.delay(...)  --register-->  turn record (queued) + conversation queue
    worker: claim (head of the conversation queue, lease)  -> running
        progress after each tool round  -> checkpoint in the turn record (persist, then proceed)
        then one outcome, from the table in `decide`:
        answer                          -> conversation envelope + succeeded, atomically
        resumable failure               -> checkpoint + due time in the retry index (waiting);
                                           the pump wakes resume_turn when due
        anything else / attempts spent  -> dead-letter entry + dead_lettered, atomically
        lease lost / Redis unreachable  -> nothing written; recovery wakes the turn again
        worker shutting down            -> handed over at the next check point: queued again
                                           from the last checkpoint, woken at once (a deploy)
    the next turn of the conversation is woken when this one ends.

A turn's Celery task id is its turn id; resume_turn messages reuse it, so `AsyncResult.get()`
on the submitted task sees the final result however many attempts it took. Every message is
only a wake-up: the turn record decides what runs, so duplicates and redeliveries are harmless
(tasks/store/records.py draws the states).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import orjson
import redis
from celery import Task
from celery.exceptions import Ignore, Reject

from agent import (
    AgentError,
    AgentInput,
    AgentResult,
    AgentRunCheckpoint,
    CheckpointFormatError,
    ConversationMismatchError,
    InvalidRunInputError,
    MessageDeniedError,
    ModelCallPhase,
    ModelCallReport,
    ProgressKind,
    ProgressReport,
    ResponseReport,
    RunCheckpointError,
    RunPause,
    ToolCallPhase,
    ToolCallReport,
    can_resume,
)
from tasks.core.backoff import backoff_delay_s
from tasks.core.errors import (
    BadPayload,
    HandedOver,
    InvalidTurnRequest,
    JobError,
    LeaseLost,
    PoisonTurn,
    Reason,
    StateLost,
    TurnDeadLettered,
    UnreadableRecord,
)
from tasks.core.payload import TurnRequest, check_turn_id, parse_payload, registration_of
from tasks.core.redact import redact
from tasks.operate.people import pending_actions, recorded_decisions, requests_json
from tasks.queue.app import app
from tasks.queue.broker import REFUSED_WRITES
from tasks.queue.context import JobContext, job_context
from tasks.queue.results import PAUSED, RUNNING, WAITING, report_state, write_final_result
from tasks.store.client import STAMP_HEADER, lost_state, stamp_of
from tasks.store.conversations import envelope_bytes
from tasks.store.dead_letters import file_dead_letter
from tasks.store.journal import call_fields, read_journal, response_fields
from tasks.store.progress import FrameWriter, apply_frames
from tasks.store.records import ClaimStatus, Registered, TurnRecord
from tasks.telemetry.tracing import AttemptTrace, current_trace
from tasks.telemetry.tracing import attempt as trace_attempt
from tasks.turn.registry import build_agent

logger = logging.getLogger("agentjobs.turns")


_T = TypeVar("_T")

# How a turn waits for a store that refuses its writes: from the first retry to the longest.
STORE_RETRY_FIRST_S = 0.1
STORE_RETRY_MAX_S = 2.0
# Errors that mean the store refuses writes for now, not that the write is wrong: the
# broker's refusals (full, a replica), and still loading or unreachable. redis-py maps OOM,
# READONLY and LOADING replies to their own classes (and drops the code from the text); the
# rest keep theirs.
_REFUSED = (
    *REFUSED_WRITES,
    redis.exceptions.BusyLoadingError,
    redis.ConnectionError,
    redis.TimeoutError,
)
_REFUSAL_CODES = ("TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "NOREPLICAS", "OOM", "READONLY")


def store_refused(exc: redis.RedisError) -> bool:
    """Whether a Redis error is the store refusing writes for a while, not a defect of the
    write itself."""
    if isinstance(exc, _REFUSED):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(_REFUSAL_CODES)


class Outcome(StrEnum):
    SUCCEED = "succeed"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    HAND_OVER = "hand_over"  # this worker is shutting down: another takes the turn at once
    PAUSE = "pause"  # a call waits for a person: the turn holds no worker until decided
    IGNORE = "ignore"  # write nothing: another delivery owns the turn, or Redis is away


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    reason: Reason | None = None
    error: BaseException | None = None
    # The checkpoint to keep (a failed run's), when the failure carries one.
    checkpoint: AgentRunCheckpoint | None = None


# Errors the runtime raises at a door (before or instead of running), by dead-letter reason.
_DOOR_REASONS: dict[type[BaseException], Reason] = {
    CheckpointFormatError: Reason.INVALID_CHECKPOINT,
    ConversationMismatchError: Reason.CONVERSATION_MISMATCH,
    InvalidRunInputError: Reason.BAD_PAYLOAD,
    MessageDeniedError: Reason.MESSAGE_DENIED,
}


def decide(exc: BaseException, *, attempt: int, max_attempts: int) -> Decision:
    """The one table from a failed attempt's exception to what happens to the turn."""
    if isinstance(exc, HandedOver) or isinstance(getattr(exc, "cause", None), HandedOver):
        return Decision(Outcome.HAND_OVER)
    if isinstance(exc, RunCheckpointError):
        if isinstance(exc.cause, LeaseLost | redis.RedisError):
            return Decision(Outcome.IGNORE)
        if not can_resume(exc):
            return Decision(Outcome.DEAD_LETTER, Reason.NON_RESUMABLE, exc.cause, exc.checkpoint)
        if attempt >= max_attempts:
            return Decision(Outcome.DEAD_LETTER, Reason.MAX_ATTEMPTS, exc.cause, exc.checkpoint)
        return Decision(Outcome.RETRY, None, exc.cause, exc.checkpoint)
    if isinstance(exc, LeaseLost | redis.RedisError):
        return Decision(Outcome.IGNORE)
    if isinstance(exc, JobError):
        return Decision(Outcome.DEAD_LETTER, exc.reason, exc)
    if isinstance(exc, AgentError):
        return Decision(
            Outcome.DEAD_LETTER, _DOOR_REASONS.get(type(exc), Reason.INTERNAL_ERROR), exc
        )
    return Decision(Outcome.DEAD_LETTER, Reason.INTERNAL_ERROR, exc)


def register_turn(
    ctx: JobContext,
    turn_id: str,
    kwargs: Any,
    *,
    checkpoint: bytes = b"",
    replay_of: str = "",
    request: TurnRequest | None = None,
    fresh: bool = False,
) -> tuple[str, Registered]:
    """Record a submitted turn behind its conversation's earlier turns; returns its namespace
    ('' for a payload too broken to queue) and whether it was new. `request` is `kwargs`
    already parsed, when the caller has it; `fresh` says this process made the id up (a
    uuid nobody else can hold), so its ownership needs no check."""
    if request is None:
        with contextlib.suppress(BadPayload):
            request = parse_payload(kwargs, max_deadline_s=ctx.settings.max_deadline_s)
    if request is not None:
        agent_name, conversation_id, namespace = (
            request.agent,
            request.conversation_id,
            request.namespace,
        )
    else:
        agent_name, conversation_id, namespace = registration_of(kwargs)
    if not fresh and not ctx.records.claim_turn_id(turn_id, namespace):
        return namespace, Registered.FOREIGN
    deadline_s = (request.deadline_s if request else None) or ctx.settings.turn_deadline_s
    registered = ctx.records.register(
        turn_id,
        payload=orjson.dumps(kwargs),
        agent=agent_name,
        conversation_id=conversation_id,
        namespace=namespace,
        checkpoint=checkpoint,
        replay_of=replay_of,
        deadline_s=deadline_s,
        trace=current_trace() or "",  # the submitter's trace: every attempt joins it
    )
    return namespace, registered


def check_request(args: Any, kwargs: Any, *, max_deadline_s: float) -> TurnRequest:
    """run_turn.delay's arguments as a turn, or InvalidTurnRequest naming what is wrong."""
    if args:
        raise InvalidTurnRequest(
            "<args>",
            "takes keyword arguments only: run_turn.delay(agent=..., "
            "conversation_id=..., message=...)",
        )
    try:
        return parse_payload(kwargs or {}, max_deadline_s=max_deadline_s)
    except BadPayload as exc:
        raise InvalidTurnRequest(exc.field, exc.problem) from None


def check_task_id(task_id: object) -> str:
    try:
        return check_turn_id(task_id)
    except BadPayload as exc:
        raise InvalidTurnRequest(exc.field, exc.problem) from None


class SubmitTurnTask(Task):  # type: ignore[misc]
    """run_turn's task class: submitting checks the request and registers the turn before its
    message is published, which fixes the conversation's order at submission time."""

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        ctx = job_context()
        request = check_request(args, kwargs, max_deadline_s=ctx.settings.max_deadline_s)
        fresh = task_id is None
        task_id = str(uuid.uuid4()) if task_id is None else check_task_id(task_id)
        namespace, registered = register_turn(ctx, task_id, kwargs, request=request, fresh=fresh)
        if registered is Registered.FOREIGN:
            # Neither the other conversation nor its tenant is named: the caller may not know it.
            raise InvalidTurnRequest(
                "task_id", "names a turn of another conversation; choose a new id"
            )
        if registered is Registered.CONFLICT:
            raise InvalidTurnRequest(
                "task_id", "was submitted with another request; choose a new id"
            )
        if registered is Registered.EXISTS:
            return self.AsyncResult(task_id)  # the same request again: the same turn
        try:
            return self.publish(task_id, kwargs, **options)
        except Exception:
            # Nothing was published: take the turn back so it does not run behind the
            # caller's back when the caller retries with a new id.
            ctx.records.unregister(task_id, namespace)
            raise

    def publish(self, turn_id: str, kwargs: Any, **options: Any) -> Any:
        """Publish a registered turn's message, stamped with the store's epoch: a worker that
        finds no record for it can tell a lost store from an unknown turn (store/client.py)."""
        stamp = job_context().epoch.stamp()
        options["headers"] = {**(options.get("headers") or {}), STAMP_HEADER: stamp}
        return super().apply_async(None, kwargs, task_id=turn_id, **options)


_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    # Expected outcomes, logged without a traceback.
    "throws": (TurnDeadLettered,),
}


@app.task(name="tasks.run_turn", base=SubmitTurnTask, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
def run_turn(self: Task, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one turn of a conversation: run_turn.delay(agent=, conversation_id=, message=,
    identity=None, message_from=None, time=None)."""
    submitted = kwargs if not args else {"<args>": list(args)}
    return drive_turn(
        self.request.id, submitted, worker=self.request.hostname or "", stamp=_stamp(self.request)
    )


@app.task(name="tasks.resume_turn", **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
def resume_turn(
    self: Task,
    turn_id: str,
    namespace: str | None = None,
    agent: str = "",
    conversation_id: str = "",
) -> dict[str, Any]:
    """Wake a recorded turn: a retry that is due, the next turn of a conversation, or a turn
    whose worker died. What runs is decided by the turn record; `agent` and
    `conversation_id` only name the turn in Flower and task events (and in a state_lost
    dead letter, when the record is gone)."""
    return drive_turn(
        turn_id,
        None,
        namespace=namespace,
        worker=self.request.hostname or "",
        stamp=_stamp(self.request),
        known={"agent": agent, "conversation_id": conversation_id},
    )


def _stamp(request: Any) -> dict[str, Any] | None:
    # Celery keeps custom headers in request.headers, and as attributes too.
    return stamp_of(request.headers) or stamp_of(vars(request))


def submit_turn(turn_id: str, kwargs: Any, *, checkpoint: bytes = b"", replay_of: str = "") -> None:
    """Register and publish a turn outside run_turn.delay (a dead-letter replay), resuming
    `checkpoint` when given; `turn_id` is one this process made up. Its message goes out at
    once, so it starts as soon as a worker is free. Idempotent for one turn_id: registering
    is a no-op the second time and a duplicate message is dropped by the turn record."""
    ctx = job_context()
    register_turn(ctx, turn_id, kwargs, checkpoint=checkpoint, replay_of=replay_of, fresh=True)
    run_turn.publish(turn_id, kwargs if isinstance(kwargs, dict) else {})


def wake(
    turn_id: str | None,
    namespace: str | None = None,
    agent: str = "",
    conversation_id: str = "",
) -> None:
    """Publish a wake-up for a turn (its namespace, when known, spares the worker a lookup)."""
    if turn_id is None:
        return
    try:
        resume_turn.apply_async(
            args=[turn_id, namespace],
            kwargs={"agent": agent, "conversation_id": conversation_id},
            task_id=turn_id,
            headers={STAMP_HEADER: job_context().epoch.stamp()},
        )
    except Exception as exc:  # the pump wakes stalled heads; never fail a finished turn for this
        logger.warning("could not wake turn %s (%s); the pump will", turn_id, exc)


def drive_turn(
    turn_id: str,
    submitted: Mapping[str, Any] | None,
    *,
    worker: str,
    namespace: str | None = None,
    stamp: Mapping[str, Any] | None = None,
    known: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    ctx = job_context()
    if ctx.leases.draining:
        # This worker is shutting down: the message goes back to the broker as it came, for
        # a worker that stays (tasks/turn/worker.py).
        raise Reject(requeue=True)
    try:
        if namespace is None:
            namespace = _namespace_of(ctx, turn_id, submitted, stamp, known)
        if not namespace:
            _dead_letter_bad_payload(ctx, turn_id, submitted)
            raise Ignore()
        token = uuid.uuid4().hex
        lease_ttl_s = ctx.settings.lease_ttl_s
        claim = ctx.records.claim(turn_id, namespace, token, lease_ttl_s, worker)
        if claim.status is ClaimStatus.MISSING:
            _refuse_lost_state(ctx, turn_id, namespace, submitted, stamp, known, worker=worker)
        if claim.status is ClaimStatus.MISSING and submitted is not None:
            # Sent without going through run_turn.delay (app.send_task, a forged message).
            if register_turn(ctx, turn_id, submitted)[1] is Registered.FOREIGN:
                _drop_foreign(turn_id)
            claim = ctx.records.claim(turn_id, namespace, token, lease_ttl_s, worker)
        if claim.record is None:
            logger.info("turn %s not run by this delivery: %s", turn_id, claim.status)
            raise Ignore()
        turn = _Turn(ctx, claim.record, token=token, stored=claim.stored)
        with (
            trace_attempt(ctx, claim.record, token) as turn.trace,
            ctx.leases.holding(turn_id, namespace, token, on_renewed=turn.report_running),
        ):
            return turn.finish(turn.attempt_once())
    except UnreadableRecord as exc:
        ctx.records.note_unreadable(exc)  # nothing can be run or ended from it
        raise Ignore() from None
    except redis.RedisError as exc:
        # Redis is unreachable: nothing can be recorded now. The turn's lease runs out and the
        # pump wakes it again once Redis answers.
        logger.warning("turn %s: Redis unavailable (%s); leaving it to recovery", turn_id, exc)
        raise Ignore() from None


def _drop_foreign(turn_id: str) -> None:
    """A message that would make `turn_id` a turn of a second conversation: dropped, and the
    turn that owns the id is left as it is."""
    logger.warning(
        "message for turn %s dropped: that id names a turn of another conversation", turn_id
    )
    raise Ignore()


def _namespace_of(
    ctx: JobContext,
    turn_id: str,
    submitted: Mapping[str, Any] | None,
    stamp: Mapping[str, Any] | None = None,
    known: Mapping[str, str] | None = None,
) -> str:
    """The conversation namespace a delivery claims under ('' for a broken payload)."""
    if submitted is not None:
        return registration_of(submitted)[2]
    record = ctx.records.get(turn_id)
    if record is None:
        _refuse_lost_state(ctx, turn_id, "", None, stamp, known, worker="")
        logger.warning("resume_turn for unknown turn %s: ignored", turn_id)
        raise Ignore()
    return record.namespace


def _refuse_lost_state(
    ctx: JobContext,
    turn_id: str,
    namespace: str,
    submitted: Mapping[str, Any] | None,
    stamp: Mapping[str, Any] | None,
    known: Mapping[str, str] | None,
    *,
    worker: str,
) -> None:
    """A message whose turn record is missing: when the store lost it (tasks/store/client.py), file
    the turn as state_lost from what the message carries, rather than run it on what is left of
    its conversation (raises Ignore or TurnDeadLettered); otherwise return (an unknown turn)."""
    if stamp is None:
        return
    ctx.epoch.check(worker)  # read now, not from the cache: the verdict depends on it
    why = lost_state(stamp, ctx.epoch.current(), record_ttl_s=ctx.settings.record_ttl_s)
    if not why:
        return
    ctx.epoch.message_from(str(stamp.get("epoch", "")), worker, turn_id)
    logger.error("turn %s: its record is gone, the state store lost it: %s", turn_id, why)
    payload: Any = dict(submitted) if submitted is not None else {**(known or {}), "lost": True}
    agent_name, conversation_id = str(payload.get("agent", "")), ""
    if submitted is not None:
        agent_name, conversation_id, _ = registration_of(submitted)
    else:
        conversation_id = str(payload.get("conversation_id", ""))
    if not ctx.records.claim_turn_id(turn_id, namespace):
        _drop_foreign(turn_id)
    ctx.records.register(
        turn_id,
        payload=orjson.dumps(payload),
        agent=agent_name,
        conversation_id=conversation_id,
        namespace=namespace,
        deadline_s=ctx.settings.turn_deadline_s,
    )
    record = ctx.records.get(turn_id, namespace)
    if record is None or record.state.terminal:
        raise Ignore()
    turn = _Turn(ctx, record, token="", stored=None)
    turn.finish(Decision(Outcome.DEAD_LETTER, Reason.STATE_LOST, StateLost(turn_id, why)))


def _dead_letter_bad_payload(
    ctx: JobContext, turn_id: str, submitted: Mapping[str, Any] | None
) -> None:
    """A turn that was never queued: dead-letter it as bad_payload (token '': no claim)."""
    record = ctx.records.get(turn_id, "")
    if record is None and submitted is not None:
        if register_turn(ctx, turn_id, submitted)[1] is Registered.FOREIGN:
            _drop_foreign(turn_id)
        record = ctx.records.get(turn_id, "")
    if record is None or record.state.terminal:
        return
    try:
        parse_payload(record.payload)
    except BadPayload as exc:
        turn = _Turn(ctx, record, token="", stored=None)
        turn.finish(Decision(Outcome.DEAD_LETTER, exc.reason, exc))


class _Turn:
    """One delivery's work on one claimed turn: one attempt, then its outcome."""

    def __init__(
        self, ctx: JobContext, record: TurnRecord, *, token: str, stored: bytes | None
    ) -> None:
        self.ctx = ctx
        self.record = record
        self.turn_id = record.turn_id
        self.namespace = record.namespace
        self.token = token
        self.attempt = record.attempt
        self.stored = stored
        self.last_checkpoint: AgentRunCheckpoint | None = None
        self.frames = FrameWriter(None)
        self.journal_lock = threading.Lock()
        self.unwritten_response: dict[str, bytes] | None = None
        # Whether the seeded report is worth a write: only when a time layer fixed the turn's
        # clock, since otherwise a fresh start rebuilds everything it holds.
        self.persist_seed = False
        # The turn's iteration in flight, across attempts: each completed round starts the next.
        self.iteration = record.iteration or 1
        self.result: AgentResult | None = None
        self.model_calls = 0
        self.report_lock = threading.Lock()
        self.outcome_decided = False
        self.reported_iteration = 0
        # The attempt's spans (tasks/telemetry/tracing.py), fed by the hooks; None when not tracing.
        self.trace: AttemptTrace | None = None

    def _write(self, write: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """A write of this turn to the store, tried again while the store refuses it (full,
        read-only, away). A refusal is not a crash of the turn: giving the turn up here would
        let its lease run out and count the next start toward poison, and run again the tool
        rounds it could not persist. The lease keeper goes on renewing meanwhile; a lease
        lost all the same shows in the write's own answer once the store takes writes."""
        delay_s = STORE_RETRY_FIRST_S
        refused_since: float | None = None
        while True:
            try:
                result = write(*args, **kwargs)
            except redis.RedisError as exc:
                if not store_refused(exc) or self.ctx.leases.draining or self._overdue():
                    raise
                if refused_since is None:
                    refused_since = time.monotonic()
                    logger.warning(
                        "turn %s: the store refuses writes (%s); holding the turn and trying again",
                        self.turn_id,
                        exc,
                    )
                time.sleep(delay_s)
                delay_s = min(STORE_RETRY_MAX_S, delay_s * 2)
                continue
            if refused_since is not None:
                logger.info(
                    "turn %s: the store took the write after %.1f s",
                    self.turn_id,
                    time.monotonic() - refused_since,
                )
            return result

    def _overdue(self) -> bool:
        """Past the turn's deadline (the pump ends it then): stop holding it for the store."""
        deadline_ms = self.record.deadline_at_ms
        return bool(deadline_ms) and time.time() * 1000 > deadline_ms

    def attempt_once(self) -> Decision:
        settings = self.ctx.settings
        if self.record.deliveries > settings.max_deliveries:
            poison = PoisonTurn(self.turn_id, self.record.deliveries - 1)
            return Decision(Outcome.DEAD_LETTER, Reason.POISON, poison)
        try:
            self.result = self._run_agent(parse_payload(self.record.payload))
        except Exception as exc:
            decision = decide(exc, attempt=self.attempt, max_attempts=settings.max_attempts)
            if decision.reason is Reason.INTERNAL_ERROR:
                logger.exception("turn %s failed outside the agent run", self.turn_id)
            return decision
        if self.result.pause is not None:
            return Decision(Outcome.PAUSE)
        return Decision(Outcome.SUCCEED)

    def report_running(self) -> None:
        """Mirror `running` to Celery's result backend. Called after each persisted round and
        by the lease keeper's first renewal (a quarter lease in), not at the claim: a result
        write costs a short turn a fifth of its throughput, and nobody can see a state that
        lasts less than that. Never after the turn's outcome is decided, so it cannot
        overwrite the final result this process writes."""
        with self.report_lock:
            if self.outcome_decided or self.reported_iteration == self.iteration:
                return
            self.reported_iteration = self.iteration
            info = {"state": "running", "attempt": self.attempt, "iteration": self.iteration}
            report_state(self.turn_id, RUNNING, info)

    def _repair_result(self) -> None:
        """This delivery lost the turn (it stalled past its lease): if the turn has ended
        meanwhile, make sure a late state report of ours did not hide its final result."""
        write_final_result(self.ctx, self.turn_id, self.namespace)

    def finish(self, decision: Decision) -> dict[str, Any]:
        """Write the outcome; returns the reply or raises what Celery should see."""
        with self.report_lock:
            self.outcome_decided = True
        if self.trace is not None:
            answer = self.result.content if self.result is not None else ""
            reason = str(decision.reason or "")
            self.trace.outcome(str(decision.outcome), decision.error, reason, answer)
        if decision.outcome is Outcome.IGNORE:
            self._repair_result()
        if decision.outcome is Outcome.HAND_OVER:
            self._hand_over()
        if decision.outcome is Outcome.PAUSE:
            assert self.result is not None and self.result.pause is not None
            self._pause(self.result.pause)
        if decision.outcome is Outcome.SUCCEED:
            assert self.result is not None
            return self._succeed(self.result)
        if decision.outcome is Outcome.RETRY:
            assert decision.error is not None and decision.checkpoint is not None
            self._schedule_retry(decision.error, decision.checkpoint)
        elif decision.outcome is Outcome.DEAD_LETTER:
            assert decision.reason is not None and decision.error is not None
            self._dead_letter(decision.reason, decision.error, decision.checkpoint)
        raise Ignore()

    def _run_agent(self, request: TurnRequest) -> AgentResult:
        agent = build_agent(request.agent, self.ctx.settings.agents)
        # The iteration in flight when an earlier delivery stopped, if its response was kept:
        # it goes on without a second model call or a second run of a completed tool call.
        journal = read_journal(self.record.journal)
        stored = None
        if self.stored is not None:
            key = self.ctx.store.key(self.namespace)
            stored = self.ctx.store.recent.read(self.stored, key, self.namespace)
        if self.record.checkpoint or self.record.frames:
            # A later attempt, or a redelivery after a crash: resume from the last persisted
            # progress; tools of completed iterations do not run again.
            base = stored
            if self.record.checkpoint:
                base = AgentRunCheckpoint.from_json(self.record.checkpoint)
            checkpoint = apply_frames(base, self.record.frames)
            assert checkpoint is not None
            self.last_checkpoint = checkpoint
            self.frames = FrameWriter(checkpoint)
            decisions = recorded_decisions(self.record)
            if journal is not None and journal.requests and decisions:
                # A pause a person answered: go on with the decisions, not the model.
                requests = tuple(journal.requests.values())
                pause = RunPause(checkpoint, journal, requests)
                return agent.resume(decisions, pause=pause, time=request.time, **self._hooks())
            return agent.resume_on_error(
                checkpoint, time=request.time, journal=journal, **self._hooks()
            )
        self.last_checkpoint = stored
        self.frames = FrameWriter(stored)
        self.persist_seed = agent.time_layer is not None
        turn_input = AgentInput(
            message=request.message,
            continue_from=stored,
            identity=request.identity,
            message_from=request.message_from,
            time=request.time,
        )
        return agent.run(turn_input, journal=journal, **self._hooks())

    def _hooks(self) -> dict[str, Any]:
        return {
            "on_report": self.persist,
            "on_tool_call": self.tool_call,
            "on_model_call": self.model_call,
            "on_response": self.response,
        }

    def model_call(self, report: ModelCallReport) -> None:
        """A check point before each model call after the attempt's first (which follows the
        claim at once): a cancelled, overdue or taken-over turn stops here, before it pays for
        another call; on a worker that is shutting down, the turn is handed over here."""
        if report.phase is not ModelCallPhase.STARTED:
            if self.trace is not None:
                self.trace.model_call(report)
            return
        self.model_calls += 1
        if self.ctx.leases.draining:
            raise HandedOver(self.turn_id)
        if self.model_calls > 1 and not self._write(
            self.ctx.records.renew,
            self.turn_id,
            self.namespace,
            self.token,
            self.ctx.settings.lease_ttl_s,
        ):
            raise LeaseLost(self.turn_id)
        if self.trace is not None:  # past the check point: the call is made
            self.trace.model_call(report)

    def response(self, report: ResponseReport) -> None:
        """Journal a model response before any of its tools runs (tasks/store/journal.py): it goes
        with the first call's start, in the same write, so the journal costs no round trip."""
        with self.journal_lock:
            self.unwritten_response = response_fields(report)
        if self.trace is not None:
            self.trace.response(report)

    def tool_call(self, report: ToolCallReport) -> None:
        """Journal a tool call's start (its key and attempt) or outcome, with its event in
        the turn's stream (tool.started / tool.finished) in the same step. Starting is a
        check point: a turn no longer this worker's does not run the tool, and a worker that
        is shutting down hands the turn over (the journal keeps the calls that completed)."""
        if report.phase is ToolCallPhase.STARTED and self.ctx.leases.draining:
            raise HandedOver(self.turn_id)
        data: dict[str, Any] = {"tool": report.tool, "toolCallId": report.tool_call_id}
        if report.phase is ToolCallPhase.FINISHED:
            data["ok"] = bool(report.ok)
            if self.trace is not None:
                self.trace.tool_call(report)
        # Held while writing: a parallel call starts only once the response is journaled.
        with self.journal_lock:
            fields = {**(self.unwritten_response or {}), **call_fields(report)}
            if not self._write(
                self.ctx.records.write_journal,
                self.turn_id,
                self.namespace,
                self.token,
                fields,
                event_type=f"tool.{report.phase}",
                event_data=orjson.dumps(data),
            ):
                raise LeaseLost(self.turn_id)
            self.unwritten_response = None
        if report.phase is ToolCallPhase.STARTED and self.trace is not None:
            self.trace.tool_call(report)  # the start is journaled: the call runs

    def _pause(self, pause: RunPause) -> None:
        """Hold the turn for a person (tasks/operate/people.py): its progress, its paused iteration
        and its requests in the record, no lease, no worker."""
        with self.journal_lock:
            unwritten, self.unwritten_response = self.unwritten_response, None
        ttl_s = self.ctx.settings.pause_ttl_s
        expires_ms = self._write(
            self.ctx.records.pause,
            self.turn_id,
            self.namespace,
            self.token,
            ttl_s=ttl_s,
            frame=self.frames.frame(pause.checkpoint),
            requests=requests_json(pause.pending),
            kinds=[(r.request_id, str(r.kind)) for r in pause.pending],
            journal=unwritten or {},
        )
        if not expires_ms:
            self._repair_result()
            return
        record = self.ctx.records.get(self.turn_id, self.namespace)
        pending = [a.as_dict() for a in pending_actions(record)] if record else []
        info = {
            "state": "paused",
            "attempt": self.attempt,
            "iteration": self.iteration,
            "pending": pending,
        }
        report_state(self.turn_id, PAUSED, info)
        logger.info(
            "turn %s paused for %d decision(s) of a person", self.turn_id, len(pause.pending)
        )

    def _hand_over(self) -> None:
        """This worker is shutting down (a deploy) and the run stopped at a check point: give
        the turn, as last persisted, to another worker now, rather than keep this one up or
        leave the turn a lease. Calls of a parallel response that were running have finished
        and journaled their outcomes by now; a response whose first call was about to start
        is journaled first, so the next worker does not ask the model again."""
        with self.journal_lock:
            unwritten, self.unwritten_response = self.unwritten_response, None
        if unwritten and not self._write(
            self.ctx.records.write_journal, self.turn_id, self.namespace, self.token, unwritten
        ):
            return  # no longer ours: nothing to hand over
        woken = self._write(
            self.ctx.records.hand_over,
            self.turn_id,
            self.namespace,
            self.token,
            worker=self.record.worker,
            reason="shutdown",
        )
        if woken is None:
            return
        wake(woken.turn_id, woken.namespace, woken.agent, woken.conversation_id)
        logger.info(
            "turn %s handed over at iteration %d: this worker is shutting down",
            self.turn_id,
            self.iteration,
        )

    def persist(self, report: ProgressReport) -> None:
        """Write progress before the next iteration's tools run (docs/jobs.md, guarantee 3):
        a frame of what changed since the last write (tasks/store/progress.py)."""
        self.last_checkpoint = report.checkpoint
        if report.kind is ProgressKind.SEEDED and not self.persist_seed:
            return
        if report.kind is ProgressKind.ROUND:
            self.iteration += 1
        if not self._write(
            self.ctx.records.renew,
            self.turn_id,
            self.namespace,
            self.token,
            self.ctx.settings.lease_ttl_s,
            frame=self.frames.frame(report.checkpoint),
            iteration=self.iteration,
            ends_iteration=report.kind is ProgressKind.ROUND,
        ):
            raise LeaseLost(self.turn_id)
        if report.kind is ProgressKind.ROUND:
            self.report_running()

    def _succeed(self, result: AgentResult) -> dict[str, Any]:
        reply = {
            "conversationId": self.record.conversation_id,
            "turnNumber": result.turn_number,
            "runId": result.run_id,
            "content": result.content,
            "attempts": self.attempt,
        }
        envelope = envelope_bytes(result.checkpoint)
        ended = self._write(
            self.ctx.records.succeed,
            self.turn_id,
            self.namespace,
            self.token,
            envelope=envelope,
            result=orjson.dumps(reply),
            ttl_s=self.ctx.settings.record_ttl_s,
        )
        if not ended.ended:
            self._repair_result()
            raise Ignore()
        self.ctx.store.recent.remember(self.namespace, envelope, result.checkpoint)
        wake(ended.next_head, self.namespace, ended.next_head_agent, self.record.conversation_id)
        return reply

    def _schedule_retry(self, error: BaseException, checkpoint: AgentRunCheckpoint) -> None:
        settings = self.ctx.settings
        retry_after = getattr(error, "retry_after_s", None)
        delay_s = backoff_delay_s(
            self.attempt,
            base_s=settings.backoff_base_s,
            cap_s=settings.backoff_max_s,
            retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
        )
        text = redact(f"{type(error).__name__}: {error}")
        due_ms = self._write(
            self.ctx.records.schedule_retry,
            self.turn_id,
            self.namespace,
            self.token,
            delay_ms=int(delay_s * 1000),
            next_attempt=self.attempt + 1,
            checkpoint=checkpoint.to_json(),
            error=text,
        )
        if not due_ms:
            self._repair_result()
            return
        info = {
            "state": "waiting",
            "attempt": self.attempt + 1,
            "iteration": self.iteration,
            "dueAt": due_ms,
            "lastError": text,
        }
        report_state(self.turn_id, WAITING, info)
        logger.info(
            "turn %s attempt %d failed (%s); attempt %d in %.1f s",
            self.turn_id,
            self.attempt,
            text,
            self.attempt + 1,
            delay_s,
        )

    def _base_run_id(self) -> str:
        """The stored conversation's run id: unchanged since this turn started, since only the
        head of a conversation's queue writes it. A replay resumes the entry's checkpoint only
        while it still is."""
        if not self.namespace:
            return ""
        try:
            stored = self.ctx.store.load(self.namespace)
        except (JobError, AgentError):
            return ""
        return stored.run_id if stored else ""

    def _dead_letter(
        self, reason: Reason, error: BaseException, checkpoint: AgentRunCheckpoint | None
    ) -> None:
        checkpoint = checkpoint or self.last_checkpoint
        entry_id, error_text, ended = self._write(
            file_dead_letter,
            self.ctx.records,
            self.record,
            self.token,
            reason=reason,
            error=error,
            attempts=self.attempt,
            checkpoint=checkpoint.to_json() if checkpoint is not None else b"",
            base_run_id=self._base_run_id(),
        )
        if not ended.ended:
            self._repair_result()
            return
        wake(
            ended.next_head,
            self.namespace or None,
            ended.next_head_agent,
            self.record.conversation_id,
        )
        logger.warning("turn %s dead-lettered as %s (%s)", self.turn_id, entry_id, reason)
        # No chained cause: the result backend stores the traceback, and the cause's text is
        # the provider's, unredacted. The entry holds the redacted error.
        raise TurnDeadLettered(entry_id, reason, error_text) from None
