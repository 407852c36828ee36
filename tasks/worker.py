"""What a worker process adds beside running tasks: its heartbeat, naming the turns it holds
prefetched but not started.

With the Redis broker, messages a worker prefetched stay unacknowledged when its main process
is SIGKILLed, and Redis hands them out again only after the visibility timeout (an hour).
Each beat (a quarter of the lease) records the prefetched turns under the worker's name, with
the server's clock; the pump wakes the turns of a worker whose beats stopped for a lease
lifetime, so a queued turn whose message died with its worker is woken as fast as a running
one. A turn already running is covered by its lease; a wake-up that finds nothing to do is
dropped by the turn record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, ClassVar

import orjson
import redis
from celery import bootsteps
from celery.utils.functional import maybe_list
from celery.worker import control
from celery.worker import state as worker_state

from tasks.context import JobContext, job_context
from tasks.leases import RENEWALS_PER_TTL
from tasks.payload import registration_of
from tasks.registry import check_agents

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
