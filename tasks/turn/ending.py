"""Ending a turn, and releasing one: the only module that does either.

Each outcome is one function, and each does the same things in the same order: change the
turn record (one script, atomic with whatever the outcome stores), mirror the change to
Celery's result backend, send the task event Flower needs to show it where the worker's own
events do not (tasks/queue/results.py), and wake whoever runs next:

    succeed         the conversation stored, the turn ended; wakes the conversation's next turn
    schedule_retry  released until a due time (waiting); the pump wakes it then
    wait            released until a budget or tenant cap frees (waiting); the pump wakes it
    pause           released until a person decides (paused); a decision wakes it
    hand_over       released for another worker now (a deploy); wakes it at once
    dead_letter     an entry filed, the turn ended; wakes the next turn
    cancel          the turn ended as cancelled, whatever its state; wakes the next turn
    repair          nothing changed by this delivery; makes sure the final result shows
    not_run         a delivery that could not claim its turn; tells Flower what the turn is doing

The events: a release in a worker sends task-retried (Flower: RETRY) while that worker sends
task events; an ending from outside the worker (cancel; dead_letter with token '', the pump's
deadline and pause expiry) always sends task-revoked or task-failed; an ending in the worker
raises to Celery, whose own task-succeeded or task-failed shows it. Wake-ups carry the turn's
earlier attempts as Celery's `retries`, which Flower shows.

Every door uses them: the worker's attempt (tasks/turn/attempt.py) and its delivery checks
(tasks/turn/delivery.py), a cancel (tasks/operate/control.py and the worker's revoke), the
pump's deadline and pause-expiry sweeps (tasks/turn/pump.py), a person's decision
(tasks/operate/people.py, through `wake`) and a dead-letter replay (`replay_dead_letter`).

A worker's writes go through `patiently`: a store that refuses writes for a while (full,
read-only, away) is waited for rather than taken as a crash of the turn. Doors outside a
worker write once and report the error.

Messages go out by task name (`app.send_task`), so this module needs nothing of the task
definitions in tasks/turn/tasks.py, which import it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import redis

from agent import AgentError, AgentRunCheckpoint
from tasks.core.backoff import backoff_delay_s
from tasks.core.errors import BudgetWait, JobError, Reason, TurnDeadLettered
from tasks.core.redact import redact
from tasks.core.schema import ClaimStatus, Field
from tasks.queue.app import app
from tasks.queue.broker import REFUSED_WRITES
from tasks.queue.context import JobContext
from tasks.queue.results import (
    PAUSED,
    TASK_FAILED,
    TASK_RETRIED,
    TASK_REVOKED,
    WAITING,
    failed_fields,
    inline_result,
    report_state,
    revoked_fields,
    send_ending,
    send_final_of,
    send_from_worker,
    write_final_result,
)
from tasks.store.client import STAMP_HEADER
from tasks.store.dead_letters import UNREADABLE, ReplayError, UnreadableEntry, file_dead_letter
from tasks.store.records import Ended, TurnRecord
from tasks.turn.registration import register_turn

logger = logging.getLogger("agentjobs.turns")

_T = TypeVar("_T")

RUN_TURN = "tasks.run_turn"
RESUME_TURN = "tasks.resume_turn"

# How a worker waits for a store that refuses its writes: from the first retry to the longest.
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


def patiently(
    ctx: JobContext, record: TurnRecord, write: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T:
    """A worker's write of `record`'s turn, tried again while the store refuses it. Giving
    the turn up at a refusal would let its lease run out, count the next start toward poison
    and run again the tool rounds it could not persist. The lease keeper goes on renewing
    meanwhile; a lease lost all the same shows in the write's own answer once the store
    takes writes. It stops waiting when the worker shuts down or the turn's deadline passes
    (the pump ends the turn then)."""
    delay_s = STORE_RETRY_FIRST_S
    refused_since: float | None = None
    while True:
        try:
            result = write(*args, **kwargs)
        except redis.RedisError as exc:
            if not store_refused(exc) or ctx.leases.draining or _overdue(record):
                raise
            if refused_since is None:
                refused_since = time.monotonic()
                logger.warning(
                    "turn %s: the store refuses writes (%s); holding the turn and trying again",
                    record.turn_id,
                    exc,
                )
            time.sleep(delay_s)
            delay_s = min(STORE_RETRY_MAX_S, delay_s * 2)
            continue
        if refused_since is not None:
            logger.info(
                "turn %s: the store took the write after %.1f s",
                record.turn_id,
                time.monotonic() - refused_since,
            )
        return result


def _overdue(record: TurnRecord) -> bool:
    deadline_ms = record.deadline_at_ms
    return bool(deadline_ms) and time.time() * 1000 > deadline_ms


def _write(
    ctx: JobContext,
    record: TurnRecord,
    patient: bool,
    write: Callable[..., _T],
    *args: Any,
    **kw: Any,
) -> _T:
    return patiently(ctx, record, write, *args, **kw) if patient else write(*args, **kw)


def mirror_state(ctx: JobContext, record: TurnRecord, state: str, info: dict[str, Any]) -> None:
    """Mirror a released turn's state (WAITING, PAUSED, RUNNING) to Celery's backend. Celery's
    store reads the key before it writes, so as not to overwrite a success, but not in one step:
    a turn that ended in between (a decision resumed it and it succeeded, a cancel) would be
    left showing `state` for good. Read after the write, an ended record gets its final result
    written again (the mixed soak found a succeeded turn whose result said PAUSED)."""
    report_state(record.turn_id, state, info)
    try:
        if ctx.records.has_ended(record.turn_id, record.namespace):
            write_final_result(ctx, record.turn_id, record.namespace)
    except redis.RedisError as exc:
        logger.warning("turn %s: its final result was not checked (%s)", record.turn_id, exc)


# -- messages ------------------------------------------------------------------------------------


def publish_turn(ctx: JobContext, turn_id: str, kwargs: Any, **options: Any) -> Any:
    """Publish a registered turn's run_turn message, stamped with the store's epoch: a worker
    that finds no record for it can tell a lost store from an unknown turn (store/client.py)."""
    options["headers"] = {**(options.get("headers") or {}), STAMP_HEADER: ctx.epoch.stamp()}
    options.setdefault("add_to_parent", False)
    options.setdefault("argsrepr", "()")
    options.setdefault("kwargsrepr", shown(kwargs))
    return app.send_task(RUN_TURN, kwargs=kwargs, task_id=turn_id, **options)


# Celery shows a message's arguments (task events, Flower) as their repr, cut at this length.
_SHOWN_MAX = 1024


def shown(value: Any) -> str:
    """A message's arguments as Celery shows them. Celery's own (saferepr, for any object)
    costs a submission a tenth of a millisecond; a turn's are JSON values, whose repr is the
    same text."""
    text = repr(value)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 3] + "..."


def wake(
    ctx: JobContext,
    turn_id: str | None,
    namespace: str | None = None,
    agent: str = "",
    conversation_id: str = "",
    *,
    attempt: int | None = None,
) -> None:
    """Publish a wake-up for a turn (its namespace, when known, spares the worker a lookup).
    The message's `retries` is the number of attempts before the turn's current one, which
    task-received events carry to Flower; `attempt`, when the caller knows it, spares one
    read of the record. Never fails the caller: the pump wakes a stalled conversation head
    anyway."""
    if turn_id is None:
        return
    if attempt is None:
        attempt = _attempt_of(ctx, turn_id, namespace)
    args = [turn_id, namespace]
    kwargs = {"agent": agent, "conversation_id": conversation_id}
    try:
        app.send_task(
            RESUME_TURN,
            args=args,
            kwargs=kwargs,
            argsrepr=shown(args),
            kwargsrepr=shown(kwargs),
            task_id=turn_id,
            headers={STAMP_HEADER: ctx.epoch.stamp()},
            retries=max(0, attempt - 1),
            # A turn woken from a task (the next of a conversation) is not its child.
            add_to_parent=False,
        )
    except Exception as exc:
        logger.warning("could not wake turn %s (%s); the pump will", turn_id, exc)


def _attempt_of(ctx: JobContext, turn_id: str, namespace: str | None) -> int:
    """The turn's current attempt, from its record (1 when it cannot be read): one field, in
    one round trip, from every shard when the namespace is not known."""
    keys = ctx.keys
    shards = [keys.for_namespace(namespace)] if namespace is not None else keys.all_shards()
    try:
        with ctx.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.hget(shard.turn(turn_id), Field.ATTEMPT)
            found = [value for value in pipe.execute() if value]
        return int(found[0]) if found else 1
    except (redis.RedisError, ValueError):
        return 1


def _wake_next(ctx: JobContext, record: TurnRecord, ended: Ended) -> None:
    wake(
        ctx,
        ended.next_head,
        record.namespace or None,
        ended.next_head_agent,
        record.conversation_id,
        # Only a conversation's head ever runs: the turn behind it has not started yet.
        attempt=1,
    )


# -- the outcomes --------------------------------------------------------------------------------


def succeed(
    ctx: JobContext,
    record: TurnRecord,
    token: str,
    *,
    envelope: bytes = b"",
    frame: bytes = b"",
    reply: Mapping[str, Any],
    usage: bytes = b"",
) -> bool:
    """Store the conversation (a whole `envelope` or one conversation `frame`,
    tasks/store/conversations.py) and end the turn as succeeded, with its attempt's reported
    tokens (`usage`, tasks/budgets/usage.py) and its Celery result when
    the result backend is the state Redis (otherwise Celery writes it from the reply the
    worker returns); wake the next turn. False when the turn was no longer this delivery's
    (nothing written but the result's repair)."""
    ended = patiently(
        ctx,
        record,
        ctx.records.succeed,
        record.turn_id,
        record.namespace,
        token,
        envelope=envelope,
        frame=frame,
        result=orjson.dumps(reply),
        ttl_s=ctx.settings.record_ttl_s,
        celery_result=inline_result(ctx, record.turn_id, reply),
        usage=usage,
    )
    if not ended.ended:
        repair(ctx, record)
        return False
    _wake_next(ctx, record, ended)
    return True


def schedule_retry(
    ctx: JobContext,
    record: TurnRecord,
    token: str,
    *,
    error: BaseException,
    checkpoint: AgentRunCheckpoint,
    iteration: int,
) -> bool:
    """Release the turn until its next attempt is due, by backoff with jitter (or the
    provider's retry-after); the pump wakes it then. False when it was no longer ours."""
    settings = ctx.settings
    retry_after = getattr(error, "retry_after_s", None)
    delay_s = backoff_delay_s(
        record.attempt,
        base_s=settings.backoff_base_s,
        cap_s=settings.backoff_max_s,
        retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
    )
    text = redact(f"{type(error).__name__}: {error}")
    due_ms = patiently(
        ctx,
        record,
        ctx.records.schedule_retry,
        record.turn_id,
        record.namespace,
        token,
        delay_ms=int(delay_s * 1000),
        next_attempt=record.attempt + 1,
        checkpoint=checkpoint.to_json(),
        error=text,
    )
    if not due_ms:
        repair(ctx, record)
        return False
    info = {
        "state": "waiting",
        "attempt": record.attempt + 1,
        "iteration": iteration,
        "dueAt": due_ms,
        "lastError": text,
    }
    mirror_state(ctx, record, WAITING, info)
    send_from_worker(
        record.turn_id,
        TASK_RETRIED,
        exception=f"waiting: attempt {record.attempt + 1} due in {delay_s:.1f} s; "
        f"attempt {record.attempt} failed: {text}",
    )
    logger.info(
        "turn %s attempt %d failed (%s); attempt %d in %.1f s",
        record.turn_id,
        record.attempt,
        text,
        record.attempt + 1,
        delay_s,
    )
    return True


def wait(
    ctx: JobContext, record: TurnRecord, token: str, *, held: BudgetWait, iteration: int
) -> bool:
    """Release the turn until the budget or tenant cap that held its next model call frees
    (`held.due_at_ms`), as last persisted, its attempt not counted; the pump wakes it then.
    False when it was no longer ours."""
    due_ms = patiently(
        ctx,
        record,
        ctx.records.wait,
        record.turn_id,
        record.namespace,
        token,
        due_at_ms=held.due_at_ms,
        waiting_for=held.waiting_for,
        budget=held.budget,
        limit=held.limit,
    )
    if not due_ms:
        repair(ctx, record)
        return False
    info = {
        "state": "waiting",
        "waitingFor": held.waiting_for,
        "attempt": record.attempt,
        "iteration": iteration,
        "dueAt": due_ms,
    }
    mirror_state(ctx, record, WAITING, info)
    send_from_worker(
        record.turn_id,
        TASK_RETRIED,
        exception=f"waiting for {held.waiting_for} {held.budget} ({held.limit}) until {due_ms}",
    )
    return True


def pause(
    ctx: JobContext, record: TurnRecord, token: str, *, info: Mapping[str, Any], **write: Any
) -> bool:
    """Release the turn until a person decides: its progress, paused iteration and requests
    in the record (`write`: the fields of TurnRecords.pause), no lease, no worker. `info` is
    the PAUSED state's backend info, completed with the pending actions. False when the turn
    was no longer ours."""
    from tasks.store.pending import pending_actions

    expires_ms = patiently(
        ctx, record, ctx.records.pause, record.turn_id, record.namespace, token, **write
    )
    if not expires_ms:
        repair(ctx, record)
        return False
    paused = ctx.records.get(record.turn_id, record.namespace)
    pending = [a.as_dict() for a in pending_actions(paused)] if paused else []
    mirror_state(ctx, record, PAUSED, {**info, "pending": pending})
    send_from_worker(
        record.turn_id,
        TASK_RETRIED,
        exception=f"paused: {len(pending)} decision(s) of a person pending",
    )
    return True


def hand_over(
    ctx: JobContext, record: TurnRecord, token: str, *, worker: str, reason: str, patient: bool
) -> bool:
    """Release a running turn for another worker to claim at once, queued again as last
    persisted (a deploy: `reason` "shutdown" or "grace_expired"); wakes it. False when the
    lease was no longer this turn's."""
    woken = _write(
        ctx,
        record,
        patient,
        ctx.records.hand_over,
        record.turn_id,
        record.namespace,
        token,
        worker=worker,
        reason=reason,
    )
    if woken is None:
        return False
    # Before the wake-up: the next worker's task-started has to come after it.
    send_from_worker(
        record.turn_id,
        TASK_RETRIED,
        exception=f"handed over ({reason}): {worker} is shutting down; another worker goes on",
    )
    same = woken.turn_id == record.turn_id
    wake(
        ctx,
        woken.turn_id,
        woken.namespace,
        woken.agent,
        woken.conversation_id,
        attempt=record.attempt if same else None,
    )
    return True


@dataclass(frozen=True)
class DeadLettered:
    entry_id: str
    reason: Reason
    error_text: str  # the error as filed: redacted

    def error(self) -> TurnDeadLettered:
        """What the worker raises for Celery (and result.get() raises): no chained cause,
        since the cause's text is the provider's, unredacted."""
        return TurnDeadLettered(self.entry_id, self.reason, self.error_text)


def dead_letter(
    ctx: JobContext,
    record: TurnRecord,
    token: str,
    reason: Reason,
    error: BaseException,
    *,
    checkpoint: AgentRunCheckpoint | None = None,
    patient: bool = False,
    announce: bool | None = None,
) -> DeadLettered | None:
    """File a dead-letter entry and end the turn, atomically; write its Celery result and wake
    the next turn. `token` '' forces it from outside the worker (a deadline, an expired
    pause, a turn never claimed): whoever holds the lease is fenced out. `announce`: whether
    to send the task-failed event; by default when forced (token ''), since a worker that
    raises the dead letter to Celery (pass False) gets Celery's own. None when the turn had
    ended meanwhile."""
    entry_id, error_text, ended = _write(
        ctx,
        record,
        patient,
        file_dead_letter,
        ctx.records,
        record,
        token,
        reason=reason,
        error=error,
        attempts=record.attempt,
        checkpoint=checkpoint.to_json() if checkpoint is not None else b"",
        base_run_id=stored_run_id(ctx, record.namespace),
    )
    if not ended.ended:
        repair(ctx, record)
        return None
    write_final_result(ctx, record.turn_id, record.namespace)
    dead = DeadLettered(entry_id, reason, error_text)
    if announce if announce is not None else not token:
        send_ending(record.turn_id, TASK_FAILED, role="pump", **failed_fields(dead.error()))
    _wake_next(ctx, record, ended)
    logger.warning("turn %s dead-lettered as %s (%s)", record.turn_id, entry_id, reason)
    return dead


def cancel(ctx: JobContext, record: TurnRecord, *, reason: str = "") -> bool:
    """End an unfinished turn as cancelled, whatever its state and whoever runs it (a worker
    still running it is fenced out at its next check point); write its Celery result, so
    result.get() raises TurnCancelled at once; send the task-revoked event that ends it in
    Flower; wake the next turn. False when it had ended already."""
    ended = ctx.records.cancel(
        record.turn_id, record.namespace, reason=reason, ttl_s=ctx.settings.record_ttl_s
    )
    if not ended.ended:
        return False
    write_final_result(ctx, record.turn_id, record.namespace)
    send_ending(
        record.turn_id, TASK_REVOKED, role="cancel", **revoked_fields(record.turn_id, reason)
    )
    logger.info("turn %s cancelled%s", record.turn_id, f": {reason}" if reason else "")
    _wake_next(ctx, record, ended)
    return True


def repair(ctx: JobContext, record: TurnRecord) -> None:
    """This delivery changed nothing (the turn was no longer its own): if the turn has ended
    meanwhile, make sure a late state report of ours did not hide its final result, nor
    this delivery's task-started its final event."""
    write_final_result(ctx, record.turn_id, record.namespace, resend=True)


# What Flower is told of a turn a delivery found not runnable (claim.lua's refusals). A busy
# turn runs on another delivery (Flower's STARTED is true); a missing one is not ours to show.
_NOT_RUN = {
    ClaimStatus.NOT_HEAD: "queued behind an earlier turn of its conversation",
    ClaimStatus.NOT_DUE: "waiting: its next attempt is not due yet",
    ClaimStatus.CAPPED: "held: its tenant is at its running cap",
    ClaimStatus.PAUSED: "paused: waiting for a person's decision",
}


def not_run(ctx: JobContext, turn_id: str, namespace: str, status: ClaimStatus) -> None:
    """A delivery that could not claim its turn, after its task-received and task-started:
    while this worker sends task events, show the turn as released again (RETRY) or, for one
    that has ended, as ended."""
    if status is ClaimStatus.DONE:
        send_final_of(ctx, turn_id, namespace)
    elif status in _NOT_RUN:
        send_from_worker(turn_id, TASK_RETRIED, exception=_NOT_RUN[status])


def stored_run_id(ctx: JobContext, namespace: str) -> str:
    """The run id of the conversation as stored ('' for none, or one that cannot be read).
    While a turn runs it is the run id the turn started from: only the head of a
    conversation's queue writes the conversation. A replay resumes a dead letter's checkpoint
    only while the stored run id is still the entry's."""
    if not namespace:
        return ""
    try:
        stored = ctx.store.load(namespace)
    except (JobError, AgentError):
        return ""
    return stored.run_id if stored else ""


# -- replay --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    entry_id: str
    turn_id: str
    # False when an earlier replay of this entry had already enqueued the turn.
    first: bool
    resumed_from_checkpoint: bool


def replay_dead_letter(ctx: JobContext, entry_id: str) -> Replayed:
    """Enqueue a dead-lettered turn again as a new turn with a fresh retry budget.

    It resumes the entry's checkpoint when the conversation has not moved since the turn
    started (nothing ran after it); otherwise it runs the message again on the conversation
    as it is now, so the stored history never forks. The entry is marked with the new turn
    id first (SET NX), the turn is registered and published, and only then is the entry
    removed: a replay that dies half-way is finished by the next, and two replays of one
    entry start one turn. An entry that cannot be read raises UnreadableEntry, untouched.
    """
    dead_letters = ctx.dead_letters
    found = dead_letters.find(entry_id)
    if found is None:
        replayed_as = dead_letters.replayed_as(entry_id)
        if replayed_as:
            return Replayed(entry_id, replayed_as, False, False)
        raise ReplayError(f"no dead-letter entry {entry_id!r}; `agentjobs dlq list` shows them")
    entry = dead_letters.with_bodies([found])[0]
    if UNREADABLE in entry:
        raise UnreadableEntry(entry_id, entry[UNREADABLE])
    turn_id, first = dead_letters.mark_replay(entry_id, f"replay-{uuid.uuid4()}")
    checkpoint = entry.get("checkpoint")
    namespace = str(entry.get("namespace") or "")
    resume = bool(checkpoint and namespace and entry.get("reason") != Reason.INVALID_CHECKPOINT)
    resume = resume and stored_run_id(ctx, namespace) == entry.get("baseRunId", "")
    kwargs = entry.get("kwargs")
    register_turn(
        ctx,
        turn_id,
        kwargs,
        checkpoint=orjson.dumps(checkpoint) if resume else b"",
        replay_of=entry_id,
        fresh=True,  # an id this process made up: nobody else holds it
    )
    # Published at once, so it starts as soon as a worker is free; a duplicate message (a
    # replay finished by a second one) is dropped by the turn record.
    publish_turn(ctx, turn_id, kwargs if isinstance(kwargs, dict) else {})
    dead_letters.remove([found], replayed_as=turn_id)
    return Replayed(entry_id, turn_id, first=first, resumed_from_checkpoint=resume)
