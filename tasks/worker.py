"""What a worker process adds beside running tasks: its heartbeat, naming the turns it holds
prefetched but not started, and its handover of the turns it runs when it is told to stop.

With the Redis broker, messages a worker prefetched stay unacknowledged when its main process
is SIGKILLed, and Redis hands them out again only after the visibility timeout (an hour).
Each beat (a quarter of the lease) records the prefetched turns under the worker's name, with
the server's clock; the pump wakes the turns of a worker whose beats stopped for a lease
lifetime, so a queued turn whose message died with its worker is woken as fast as a running
one. A turn already running is covered by its lease; a wake-up that finds nothing to do is
dropped by the turn record.

A warm shutdown (SIGTERM, a deploy) hands the worker's turns over instead of waiting for them
(docs/operations.md, "Deploys"). Celery alone stops consuming and then waits for every running
task, so a deploy lasted as long as the longest turn, and the SIGKILL that ends a deploy left
that turn idle for a lease. Here the turns it prefetched are woken for other workers at once,
each running turn hands its lease over at its next check point and its task ends (Celery's
wait ends with the last of them), and when shutdown_grace_s runs out, the turns still stuck in
a tool are handed over as last persisted and the process exits: a thread cannot be stopped,
and Celery would wait for it forever. Whatever the abandoned thread writes later is refused by
the lease fence. The grace is kept by a threads pool (the Procfile's); a solo pool's turn
hands over at its check points too, and a prefork pool's children are not told (its turns keep
Celery's warm shutdown).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any, ClassVar

import orjson
import redis
from celery import bootsteps
from celery.apps.worker import Worker as CeleryWorker
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.signals import worker_shutting_down
from celery.utils.functional import maybe_list
from celery.worker import control
from celery.worker import state as worker_state

from tasks.context import JobContext, job_context
from tasks.leases import RENEWALS_PER_TTL
from tasks.payload import registration_of
from tasks.registry import check_agents
from tasks.turns import wake

logger = logging.getLogger("agentjobs.worker")


def _namespace_of(request: Any) -> str:
    if request.name == "tasks.resume_turn":
        args = request.args or []
        return str(args[1]) if len(args) > 1 and args[1] else ""
    if request.name == "tasks.run_turn":
        return registration_of(request.kwargs)[2]
    return ""


def prefetched_turns() -> list[tuple[str, str]]:
    """(turn id, namespace) of the turn messages this process holds but has not started."""
    for _ in range(5):  # the consumer thread may change the sets while we copy them
        try:
            reserved = list(worker_state.reserved_requests)
            active = {request.id for request in list(worker_state.active_requests)}
            break
        except RuntimeError:
            continue
    else:
        return []
    return [
        (request.id, _namespace_of(request))
        for request in reserved
        if request.id not in active and request.name in ("tasks.run_turn", "tasks.resume_turn")
    ]


class Presence:
    def __init__(self, ctx: JobContext, name: str) -> None:
        self._ctx = ctx
        self._name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="presence", daemon=True)
        self._beat = ctx.records.script("worker_beat")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        # If Redis is away, the pump removes it once its beats are old.
        with contextlib.suppress(redis.RedisError):
            self._ctx.redis.hdel(self._ctx.keys.workers, self._name)

    def beat(self) -> None:
        received = orjson.dumps(prefetched_turns())
        self._beat(keys=[self._ctx.keys.workers], args=[self._name, received])
        # A store that lost its data is noticed here even when no message survived it
        # (tasks/state.py): the first beat learns the epoch, later ones compare.
        self._ctx.epoch.check(self._name)

    def _run(self) -> None:
        interval_s = self._ctx.settings.lease_ttl_s / RENEWALS_PER_TTL
        failing = False
        while True:
            try:
                self.beat()
            except redis.RedisError as exc:
                if not failing:  # one line per outage, not one per beat
                    logger.warning("worker heartbeat failed: %s; retrying every beat", exc)
                failing = True
            else:
                if failing:
                    logger.info("worker heartbeat written again")
                failing = False
            if self._stop.wait(interval_s):
                return


_celery_revoke = control.Panel.data["revoke"]


@control.control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")  # type: ignore[untyped-decorator]
def revoke(
    state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kwargs: Any
) -> Any:
    """Celery's revoke (and Flower's button), for turns: cancel the turn as cancel_turn does
    (every worker gets the broadcast; the first cancels, the rest find it ended). Revoking
    only in worker memory would leave the conversation waiting on a turn that never ends,
    and lose the revoke at the next restart. Other task ids are revoked as Celery does."""
    from tasks.control import cancel_turn

    ctx = job_context()
    others = []
    for one in maybe_list(task_id) or []:
        if ctx.records.get(str(one)) is None:
            others.append(one)
        elif cancel_turn(str(one), reason="revoked"):
            logger.info("turn %s revoked: cancelled", one)
    if others:
        return _celery_revoke(state, others, terminate, signal, **kwargs)
    return {"ok": "turns cancelled"}


class PresenceStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """A worker bootstep: the heartbeat runs from the worker's start to its stop."""

    requires: ClassVar[set[str]] = {"celery.worker.components:Pool"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.presence: Presence | None = None

    def start(self, parent: Any) -> None:
        ctx = job_context()
        for name, problem in check_agents(ctx.settings.agents).items():
            logger.error("agent %r is unavailable: its turns will dead-letter (%s)", name, problem)
        self.presence = Presence(ctx, parent.hostname)
        self.presence.start()

    def stop(self, parent: Any) -> None:
        if self.presence is not None:
            self.presence.stop()
            self.presence = None

    shutdown = stop


@worker_shutting_down.connect  # type: ignore[untyped-decorator]
def _stop_taking_turns(how: str = "", **_: Any) -> None:
    """SIGTERM or SIGINT reached the worker: its turns hand over from their next check point
    on. Runs in the signal handler, so it only sets an event; HandoverStep's thread, waiting
    for it, does the rest (Celery itself notices the signal up to a second later)."""
    if how == "Warm":
        job_context().leases.drain()


def hand_over_held(ctx: JobContext, worker: str) -> list[str]:
    """Hand over every turn this process still holds, as last persisted, and wake each for
    another worker; returns their ids."""
    handed = []
    for held in ctx.leases.held():
        try:
            woken = ctx.records.hand_over(
                held.turn_id, held.namespace, held.token, worker=worker, reason="grace_expired"
            )
        except redis.RedisError as exc:  # its lease runs out and the pump wakes it
            logger.warning("could not hand over turn %s: %s", held.turn_id, exc)
            continue
        if woken is not None:
            wake(woken.turn_id, woken.namespace, woken.agent, woken.conversation_id)
            handed.append(held.turn_id)
    return handed


def wake_prefetched() -> int:
    """Wake the turns this process prefetched but has not started, for other workers now:
    Celery gives their messages back only once every running task has ended. A copy that
    comes back later is dropped by the turn record."""
    turns = prefetched_turns()
    for turn_id, namespace in turns:
        wake(turn_id, namespace or None)
    return len(turns)


def _drain(ctx: JobContext, worker: str) -> None:
    ctx.leases.wait_for_drain()
    grace_s = ctx.settings.shutdown_grace_s
    started = time.monotonic()
    woken = wake_prefetched()
    logger.info(
        "shutting down: %d running turns hand over at their next check point, %d prefetched "
        "turns were woken for other workers; exiting within %g s",
        len(ctx.leases.held()),
        woken,
        grace_s,
    )
    time.sleep(max(0.0, grace_s - (time.monotonic() - started)))
    # Still running: a turn is stuck in a tool, and Celery waits for its thread forever.
    handed = hand_over_held(ctx, worker)
    logger.warning(
        "shutdown grace of %g s ran out: handed over %d turns still in a tool%s; exiting",
        grace_s,
        len(handed),
        f" ({', '.join(handed)})" if handed else "",
    )
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # nothing is lost: every turn it held is queued again and woken


class HandoverStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """A worker bootstep: a warm shutdown hands the turns over (see the module's docstring).
    Its thread waits from the start for the shutdown to begin. Celery stops the step before
    the pool, whose stop is the wait for the running tasks.

    Only in a `celery worker` process: a worker embedded in another program (Celery's test
    worker) is stopped and started again in a process that is not ours to exit."""

    requires: ClassVar[set[str]] = {"celery.worker.components:Pool"}

    def start(self, parent: Any) -> None:
        if isinstance(parent, CeleryWorker) and isinstance(parent.pool, ThreadsPool):
            args = (job_context(), parent.hostname)
            threading.Thread(target=_drain, args=args, name="handover", daemon=True).start()

    def stop(self, parent: Any) -> None:
        if isinstance(parent, CeleryWorker):
            job_context().leases.drain()  # also for a shutdown without a signal (remote control)
