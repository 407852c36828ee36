"""run_turn and resume_turn: the lifecycle of one turn on a worker.

    run_turn.delay(...)  --register-->  turn record (queued) + conversation queue
    worker: claim (head of the conversation queue, lease)  -> running
        progress after each tool round  -> checkpoint in the turn record (persist, then proceed)
        answer                          -> conversation envelope + succeeded, atomically
        resumable failure               -> checkpoint + due time in the retry index (waiting);
                                           the pump wakes resume_turn when due
        anything else / attempts spent  -> dead-letter entry + dead_lettered, atomically
    the next turn of the conversation is woken when this one ends.

A turn's Celery task id is its turn id; resume_turn messages reuse it, so `AsyncResult.get()`
on the submitted task sees the final result however many attempts it took. Every message is
only a wake-up: the turn record decides what runs, so duplicates and redeliveries are harmless.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, NoReturn

import orjson
import redis
from celery import Task
from celery.exceptions import Ignore

from agent import (
    AgentError,
    AgentInput,
    AgentResult,
    AgentRunCheckpoint,
    CheckpointFormatError,
    ConversationMismatchError,
    InvalidRunInputError,
    MessageDeniedError,
    RunCheckpointError,
    can_resume,
    is_compacted_summary,
)
from tasks.app import app
from tasks.context import JobContext, job_context
from tasks.deadletter import build_entry, entry_id_for
from tasks.errors import (
    BadPayload,
    JobError,
    LeaseLost,
    PoisonTurn,
    Reason,
    TurnDeadLettered,
)
from tasks.payload import TurnRequest, parse_payload, registration_of
from tasks.records import TERMINAL_STATES, Claim, TurnRecord, now_ms
from tasks.redact import redact
from tasks.registry import build_agent
from tasks.retry import backoff_delay_s
from tasks.store import envelope_bytes

logger = logging.getLogger("agentjobs.turns")

_REASONS: dict[type[BaseException], Reason] = {
    CheckpointFormatError: Reason.INVALID_CHECKPOINT,
    ConversationMismatchError: Reason.CONVERSATION_MISMATCH,
    InvalidRunInputError: Reason.BAD_PAYLOAD,
    MessageDeniedError: Reason.MESSAGE_DENIED,
}


def register_turn(
    ctx: JobContext,
    turn_id: str,
    kwargs: Any,
    *,
    checkpoint: bytes = b"",
    replay_of: str = "",
    base_run_id: str = "",
) -> str:
    """Record a submitted turn behind its conversation's earlier turns; returns its namespace
    ('' for a payload too broken to queue)."""
    agent_name, conversation_id, namespace = registration_of(kwargs)
    ctx.records.register(
        turn_id,
        payload=orjson.dumps(kwargs),
        agent=agent_name,
        conversation_id=conversation_id,
        namespace=namespace,
        checkpoint=checkpoint,
        replay_of=replay_of,
        base_run_id=base_run_id,
    )
    return namespace


class SubmitTurnTask(Task):  # type: ignore[misc]
    """run_turn's task class: submitting registers the turn before its message is published,
    which fixes the conversation's order at submission time."""

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        task_id = task_id or str(uuid.uuid4())
        ctx = job_context()
        namespace = register_turn(ctx, task_id, kwargs if not args else {"<args>": list(args)})
        try:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        except Exception:
            # Nothing was published: take the turn back so it does not run behind the
            # caller's back when the caller retries with a new id.
            ctx.records.unregister(task_id, namespace)
            raise


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
    return drive_turn(self.request.id, submitted, worker=self.request.hostname or "")


@app.task(name="tasks.resume_turn", **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
def resume_turn(self: Task, turn_id: str) -> dict[str, Any]:
    """Wake a recorded turn: a retry that is due, the next turn of a conversation, or a turn
    whose worker died. What runs is decided by the turn record."""
    return drive_turn(turn_id, None, worker=self.request.hostname or "")


def completed_rounds(history: list[dict[str, Any]]) -> int:
    """Tool rounds this turn has completed, counted back to its user message: the turn's
    iteration in flight is one more, across resumes (a run's own counter restarts at 1)."""
    rounds = 0
    for message in reversed(history):
        if message.get("role") == "user" and not is_compacted_summary(message):
            break
        if message.get("role") == "assistant" and message.get("toolCalls"):
            rounds += 1
    return rounds


def wake(turn_id: str | None) -> None:
    if turn_id is None:
        return
    try:
        resume_turn.apply_async(args=[turn_id], task_id=turn_id)
    except Exception:  # the pump wakes stalled heads; never fail a finished turn for this
        logger.warning("could not wake turn %s; the pump will", turn_id, exc_info=True)


def drive_turn(turn_id: str, submitted: Mapping[str, Any] | None, *, worker: str) -> dict[str, Any]:
    ctx = job_context()
    try:
        record = ctx.records.get(turn_id)
        if record is None:
            if submitted is None:
                logger.warning("resume_turn for unknown turn %s: ignored", turn_id)
                raise Ignore()
            register_turn(ctx, turn_id, submitted)  # sent without going through run_turn.delay
            record = ctx.records.get(turn_id)
            assert record is not None
        if record.state in TERMINAL_STATES:
            raise Ignore()
        try:
            request = parse_payload(record.payload)
        except BadPayload as exc:
            _Turn(ctx, record, None, token="", attempt=1).dead_letter(exc.reason, exc, None)
        token = uuid.uuid4().hex
        claim = ctx.records.claim(
            turn_id, request.namespace, token, ctx.settings.lease_ttl_s, worker
        )
        if claim.status != "claimed":
            logger.info("turn %s not run by this delivery: %s", turn_id, claim.status)
            raise Ignore()
        return _Turn(ctx, record, request, token=token, attempt=claim.attempt).run(claim)
    except redis.RedisError:
        # Redis is unreachable: nothing can be recorded now. The turn's lease runs out and the
        # pump wakes it again once Redis answers.
        logger.warning("turn %s: Redis unavailable; leaving it to recovery", turn_id, exc_info=True)
        raise Ignore() from None


class _Heartbeat:
    """Renews the conversation lease while a turn runs."""

    def __init__(self, ctx: JobContext, turn_id: str, namespace: str, token: str) -> None:
        self._args = (turn_id, namespace, token, ctx.settings.lease_ttl_s)
        self._ctx = ctx
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{turn_id}", daemon=True)

    def _beat(self) -> None:
        interval_s = self._ctx.settings.lease_ttl_s / 3
        while not self._stop.wait(interval_s):
            try:
                if not self._ctx.records.renew(*self._args):
                    return
            except redis.RedisError:
                logger.warning("lease renewal failed for turn %s", self._args[0], exc_info=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Turn:
    """One delivery's work on one claimed turn."""

    def __init__(
        self,
        ctx: JobContext,
        record: TurnRecord,
        request: TurnRequest | None,
        *,
        token: str,
        attempt: int,
    ) -> None:
        self.ctx = ctx
        self.record = record
        self.request = request
        self.turn_id = record.turn_id
        self.namespace = request.namespace if request else record.namespace
        self.token = token
        self.attempt = attempt
        self.base_run_id = record.get("base_run_id")
        self.last_checkpoint: AgentRunCheckpoint | None = None

    def run(self, claim: Claim) -> dict[str, Any]:
        settings = self.ctx.settings
        if claim.deliveries > settings.max_deliveries:
            self.dead_letter(Reason.POISON, PoisonTurn(self.turn_id, claim.deliveries - 1), None)
        with _Heartbeat(self.ctx, self.turn_id, self.namespace, self.token):
            try:
                result = self._run_agent()
            except RunCheckpointError as exc:
                if isinstance(exc.cause, LeaseLost):
                    raise Ignore() from None
                if not can_resume(exc):
                    self.dead_letter(Reason.NON_RESUMABLE, exc.cause, exc.checkpoint)
                if self.attempt >= settings.max_attempts:
                    self.dead_letter(Reason.MAX_ATTEMPTS, exc.cause, exc.checkpoint)
                self.schedule_retry(exc)
            except LeaseLost:
                raise Ignore() from None
            except (JobError, AgentError) as exc:
                reason = getattr(exc, "reason", None) if isinstance(exc, JobError) else None
                reason = reason or _REASONS.get(type(exc), Reason.INTERNAL_ERROR)
                self.dead_letter(reason, exc, self.last_checkpoint)
            except redis.RedisError:
                raise
            except Exception as exc:
                logger.exception("turn %s failed outside the agent run", self.turn_id)
                self.dead_letter(Reason.INTERNAL_ERROR, exc, self.last_checkpoint)
        return self.succeed(result)

    def _run_agent(self) -> AgentResult:
        request = self.request
        assert request is not None
        agent = build_agent(request.agent, self.ctx.settings.agents)
        saved = self.record.get("checkpoint")
        if saved:
            # A later attempt, or a redelivery after a crash: resume from the last persisted
            # progress; tools of completed iterations do not run again.
            checkpoint = AgentRunCheckpoint.from_json(saved)
            self.last_checkpoint = checkpoint
            return agent.resume_on_error(checkpoint, time=request.time, on_progress=self.persist)
        stored = self.ctx.store.load(request.namespace)
        self.base_run_id = stored.run_id if stored else ""
        self.ctx.records.set_field(self.turn_id, "base_run_id", self.base_run_id)
        self.last_checkpoint = stored
        turn_input = AgentInput(
            message=request.message,
            continue_from=stored,
            identity=request.identity,
            message_from=request.message_from,
            time=request.time,
        )
        return agent.run(turn_input, on_progress=self.persist)

    def persist(self, checkpoint: AgentRunCheckpoint) -> None:
        """Write progress before the next iteration's tools run (JOBS.md guarantee 3)."""
        self.last_checkpoint = checkpoint
        iteration = completed_rounds(checkpoint.history) + 1
        if not self.ctx.records.renew(
            self.turn_id,
            self.namespace,
            self.token,
            self.ctx.settings.lease_ttl_s,
            checkpoint=checkpoint.to_json(),
            iteration=iteration,
        ):
            raise LeaseLost(self.turn_id)

    def succeed(self, result: AgentResult) -> dict[str, Any]:
        request = self.request
        assert request is not None
        reply = {
            "conversationId": request.conversation_id,
            "turnNumber": result.turn_number,
            "runId": result.run_id,
            "content": result.content,
            "attempts": self.attempt,
        }
        ended, head = self.ctx.records.succeed(
            self.turn_id,
            self.namespace,
            self.token,
            envelope=envelope_bytes(result.checkpoint),
            result=orjson.dumps(reply),
            ttl_s=self.ctx.settings.record_ttl_s,
        )
        if not ended:
            raise Ignore()
        wake(head)
        return reply

    def schedule_retry(self, exc: RunCheckpointError) -> NoReturn:
        settings = self.ctx.settings
        retry_after = getattr(exc.cause, "retry_after_s", None)
        delay_s = backoff_delay_s(
            self.attempt,
            base_s=settings.backoff_base_s,
            cap_s=settings.backoff_max_s,
            retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
        )
        error = redact(f"{type(exc.cause).__name__}: {exc.cause}")
        scheduled = self.ctx.records.schedule_retry(
            self.turn_id,
            self.namespace,
            self.token,
            due_ms=now_ms() + int(delay_s * 1000),
            next_attempt=self.attempt + 1,
            checkpoint=exc.checkpoint.to_json(),
            error=error,
        )
        if scheduled:
            logger.info(
                "turn %s attempt %d failed (%s); attempt %d in %.1f s",
                self.turn_id,
                self.attempt,
                error,
                self.attempt + 1,
                delay_s,
            )
        raise Ignore()

    def dead_letter(
        self, reason: str, error: BaseException, checkpoint: AgentRunCheckpoint | None
    ) -> NoReturn:
        record = self.record
        saved = record.get("checkpoint")
        if checkpoint is not None:
            checkpoint_wire: Any = checkpoint.to_dict()
        else:
            checkpoint_wire = orjson.loads(saved) if saved else None
        entry_id = entry_id_for(self.turn_id)
        entry = build_entry(
            entry_id=entry_id,
            reason=reason,
            error=error,
            attempts=self.attempt,
            agent=record.get("agent"),
            conversation_id=record.get("conversation_id"),
            namespace=self.namespace,
            turn_id=self.turn_id,
            first_failed_ms=record.number("first_failed_at_ms"),
            checkpoint=checkpoint_wire,
            kwargs=record.payload,
            base_run_id=self.base_run_id,
        )
        ended, head = self.ctx.records.dead_letter(
            self.turn_id,
            self.namespace,
            self.token,
            entry_id=entry_id,
            entry=orjson.dumps(entry),
            reason=reason,
            ttl_s=self.ctx.settings.record_ttl_s,
        )
        if not ended:
            raise Ignore()
        wake(head)
        logger.warning("turn %s dead-lettered as %s (%s)", self.turn_id, entry_id, reason)
        # No chained cause: the result backend stores the traceback, and the cause's text is
        # the provider's, unredacted. The entry holds the redacted error.
        raise TurnDeadLettered(entry_id, reason, entry["error"]) from None


def submit_replay(turn_id: str, entry: Mapping[str, Any]) -> bool:
    """Enqueue a dead-lettered turn again as `turn_id`, with a fresh retry budget.

    It resumes the entry's checkpoint when the conversation has not moved since the turn
    started (nothing ran after it); otherwise it runs the message again on the conversation as
    it is now, so the stored history never forks. Returns whether it resumes the checkpoint.
    Idempotent for one turn_id: registering is a no-op the second time and a duplicate message
    is dropped by the turn record.
    """
    ctx = job_context()
    kwargs = entry.get("kwargs")
    checkpoint = entry.get("checkpoint")
    namespace = str(entry.get("namespace") or "")
    resume = False
    if checkpoint and namespace and entry.get("reason") != Reason.INVALID_CHECKPOINT:
        try:
            stored = ctx.store.load(namespace)
        except (JobError, AgentError):
            stored = None
        resume = (stored.run_id if stored else "") == entry.get("baseRunId", "")
    register_turn(
        ctx,
        turn_id,
        kwargs,
        checkpoint=orjson.dumps(checkpoint) if resume else b"",
        replay_of=str(entry.get("id", "")),
        base_run_id=str(entry.get("baseRunId", "")) if resume else "",
    )
    run_turn.apply_async(kwargs=kwargs if isinstance(kwargs, dict) else {}, task_id=turn_id)
    return resume
