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

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
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
from tasks.store import envelope_bytes, read_envelope

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
def resume_turn(self: Task, turn_id: str, namespace: str | None = None) -> dict[str, Any]:
    """Wake a recorded turn: a retry that is due, the next turn of a conversation, or a turn
    whose worker died. What runs is decided by the turn record."""
    return drive_turn(turn_id, None, namespace=namespace, worker=self.request.hostname or "")


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


def wake(turn_id: str | None, namespace: str | None = None) -> None:
    """Publish a wake-up for a turn (its namespace, when known, spares the worker a read)."""
    if turn_id is None:
        return
    try:
        resume_turn.apply_async(args=[turn_id, namespace], task_id=turn_id)
    except Exception:  # the pump wakes stalled heads; never fail a finished turn for this
        logger.warning("could not wake turn %s; the pump will", turn_id, exc_info=True)


def drive_turn(
    turn_id: str,
    submitted: Mapping[str, Any] | None,
    *,
    worker: str,
    namespace: str | None = None,
) -> dict[str, Any]:
    ctx = job_context()
    try:
        if namespace is None:
            namespace = _namespace_of(ctx, turn_id, submitted)
        if not namespace:
            _dead_letter_bad_payload(ctx, turn_id, submitted)
        token = uuid.uuid4().hex
        lease_ttl_s = ctx.settings.lease_ttl_s
        claim = ctx.records.claim(turn_id, namespace, token, lease_ttl_s, worker)
        if claim.status == "missing" and submitted is not None:
            register_turn(ctx, turn_id, submitted)  # sent without going through run_turn.delay
            claim = ctx.records.claim(turn_id, namespace, token, lease_ttl_s, worker)
        if claim.status != "claimed" or claim.record is None:
            logger.info("turn %s not run by this delivery: %s", turn_id, claim.status)
            raise Ignore()
        # The recorded payload is the one that queued under this namespace: it parses.
        request = parse_payload(claim.record.payload)
        return _Turn(ctx, claim.record, request, token=token, attempt=claim.attempt).run(claim)
    except redis.RedisError:
        # Redis is unreachable: nothing can be recorded now. The turn's lease runs out and the
        # pump wakes it again once Redis answers.
        logger.warning("turn %s: Redis unavailable; leaving it to recovery", turn_id, exc_info=True)
        raise Ignore() from None


def _namespace_of(ctx: JobContext, turn_id: str, submitted: Mapping[str, Any] | None) -> str:
    """The conversation namespace a delivery claims under ('' for a broken payload)."""
    if submitted is not None:
        return registration_of(submitted)[2]
    record = ctx.records.get(turn_id)
    if record is None:
        logger.warning("resume_turn for unknown turn %s: ignored", turn_id)
        raise Ignore()
    return record.namespace


def _dead_letter_bad_payload(
    ctx: JobContext, turn_id: str, submitted: Mapping[str, Any] | None
) -> NoReturn:
    record = ctx.records.get(turn_id)
    if record is None and submitted is not None:
        register_turn(ctx, turn_id, submitted)
        record = ctx.records.get(turn_id)
    if record is None or record.state in TERMINAL_STATES:
        raise Ignore()
    try:
        parse_payload(record.payload)
    except BadPayload as exc:
        _Turn(ctx, record, None, token="", attempt=1).dead_letter(exc.reason, exc, None)
    raise Ignore()  # the recorded payload is fine: a later delivery runs it


class _LeaseKeeper:
    """One thread per worker process renews the conversation leases of every turn the process
    is running (a thread per turn would cost more than a short turn itself)."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, str]] = {}  # token -> (turn_id, namespace)
        self._thread = threading.Thread(target=self._renew_forever, name="leases", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def holding(self, turn_id: str, namespace: str, token: str) -> Iterator[None]:
        with self._lock:
            self._held[token] = (turn_id, namespace)
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(token, None)

    def _renew_forever(self) -> None:
        lease_ttl_s = self._ctx.settings.lease_ttl_s
        while True:
            time.sleep(lease_ttl_s / 3)
            with self._lock:
                held = list(self._held.items())
            for token, (turn_id, namespace) in held:
                try:
                    if not self._ctx.records.renew(turn_id, namespace, token, lease_ttl_s):
                        with self._lock:
                            self._held.pop(token, None)  # taken over: its writes will fail
                except redis.RedisError:
                    logger.warning("lease renewal failed for turn %s", turn_id, exc_info=True)


_keepers: dict[int, _LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def lease_keeper(ctx: JobContext) -> _LeaseKeeper:
    """This process's keeper; a forked pool child starts its own (threads do not survive
    a fork)."""
    pid = os.getpid()
    with _keepers_lock:
        keeper = _keepers.get(pid)
        if keeper is None:
            keeper = _keepers[pid] = _LeaseKeeper(ctx)
        return keeper


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
        self.last_checkpoint: AgentRunCheckpoint | None = None
        self.stored: bytes | None = None
        self.reported = False

    def run(self, claim: Claim) -> dict[str, Any]:
        settings = self.ctx.settings
        self.stored = claim.stored
        if claim.deliveries > settings.max_deliveries:
            self.dead_letter(Reason.POISON, PoisonTurn(self.turn_id, claim.deliveries - 1), None)
        with lease_keeper(self.ctx).holding(self.turn_id, self.namespace, self.token):
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
        stored = None
        if self.stored is not None:
            key = self.ctx.store.key(self.namespace)
            stored = read_envelope(self.stored, key, self.namespace)
        self.last_checkpoint = stored
        # The seeded checkpoint holds nothing a fresh start would not rebuild, unless a time
        # layer fixed the turn's clock: skip that write.
        self.reported = agent.time_layer is not None
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
        if not self.reported:
            self.reported = True
            return
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
        wake(head, self.namespace)
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
            base_run_id=self._base_run_id(),
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
        wake(head, self.namespace or None)
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
    )
    run_turn.apply_async(kwargs=kwargs if isinstance(kwargs, dict) else {}, task_id=turn_id)
    return resume
