"""What a worker process adds beside running tasks: its heartbeat, naming the turns it holds
prefetched but not started, and its handover of the turns it runs when it is told to stop.
At start it also builds each registered agent once and logs what it got (announce_agents),
refusing to start over an agent that does not build when AGENTJOBS_STRICT_AGENTS=1.

A worker holds the turn messages it took in memory only (tasks/queue/broker.py): when its main
process is SIGKILLed, the ones it prefetched are gone (with kombu's unacked record, kept by
AGENTJOBS_UNACKED_WAKEUPS=1, Redis would hand them out again only after the visibility
timeout, an hour). Each beat (a quarter of the lease) records the prefetched turns under the
worker's name, with the server's clock; the pump wakes the turns of a worker whose beats
stopped for a lease lifetime, so a queued turn whose message died with its worker is woken as
fast as a running one. A turn already running is covered by its lease; a wake-up that finds
nothing to do is dropped by the turn record.

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

A message for run_turn or resume_turn whose body cannot be read as the task's arguments at all
(not JSON, not Celery's [args, kwargs, embed], another serializer, no usable task id) is
acknowledged, logged in one line and counted in Redis (`agentjobs_bad_messages_total`) by
MessageGuardStep, before Celery reads it: Celery calls any error of its own reading but three
unrecoverable, exits, and the message it restores kills every worker after it. A message whose
arguments can be read but are not a turn goes on to the task, which dead-letters it as
bad_payload.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import orjson
import redis
from celery import bootsteps
from celery.apps.worker import Worker as CeleryWorker
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.exceptions import InvalidTaskError
from celery.signals import worker_shutting_down
from celery.utils.functional import maybe_list
from celery.worker import control
from celery.worker import state as worker_state
from kombu.exceptions import ContentDisallowed, DecodeError
from kombu.serialization import prepare_accept_content

from tasks.core.errors import BadPayload
from tasks.core.payload import check_turn_id, registration_of
from tasks.queue.app import app
from tasks.queue.broker import hold_wakeups_in_memory
from tasks.queue.context import JobContext, job_context
from tasks.store.leases import RENEWALS_PER_TTL
from tasks.turn import ending
from tasks.turn.registry import AgentCheck, check_registry

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
    def __init__(self, ctx: JobContext, name: str, slots: int = 0) -> None:
        self._ctx = ctx
        self._name = name
        self._slots = slots  # the pool's concurrency: the fairness gate sizes its window by it
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
        self._beat(keys=[self._ctx.keys.workers], args=[self._name, received, self._slots])
        # A store that lost its data is noticed here even when no message survived it
        # (tasks/store/client.py): the first beat learns the epoch, later ones compare.
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
    ctx = job_context()
    others = []
    for one in maybe_list(task_id) or []:
        record = ctx.records.readable(str(one))
        if record is None:
            others.append(one)
        elif not record.state.terminal and ending.cancel(ctx, record, reason="revoked"):
            logger.info("turn %s revoked: cancelled", one)
    if others:
        return _celery_revoke(state, others, terminate, signal, **kwargs)
    return {"ok": "turns cancelled"}


def _described(check: AgentCheck) -> str:
    return f"{check.name}={check.factory} ({'builds' if check.builds else check.error})"


def announce_agents(agents: Mapping[str, str], *, strict: bool) -> list[AgentCheck]:
    """At a worker's start: build each registered agent once and log, in one line, what each
    factory gave. The app's configuration gets the registry this worker runs with (celeryconfig
    AGENTS extended by AGENTJOBS_AGENTS), so that Celery's `inspect conf`, and Flower's view of
    the configuration, show it rather than celeryconfig's dict alone. An agent that does not
    build is logged as unavailable (its turns dead-letter as agent_unavailable); with `strict`
    (AGENTJOBS_STRICT_AGENTS) the worker refuses to start instead: one line naming the agents,
    and SystemExit(1), which Celery's start turns into the process's exit status."""
    app.conf.update(AGENTS=dict(agents))
    checks = check_registry(agents)
    if not checks:
        logger.warning(
            "no agents are registered: every turn will dead-letter as unknown_agent; register "
            "them with AGENTJOBS_AGENTS=name=module:factory or in celeryconfig.py's AGENTS"
        )
        return checks
    logger.info("agents: %s", ", ".join(_described(check) for check in checks))
    failing = [check for check in checks if not check.builds]
    if failing and strict:
        named = ", ".join(f"{check.name!r} ({check.error})" for check in failing)
        one = len(failing) == 1
        logger.error(
            "refusing to start (AGENTJOBS_STRICT_AGENTS=1): %s; fix %s, or unset "
            "AGENTJOBS_STRICT_AGENTS to start anyway and dead-letter such turns as "
            "agent_unavailable",
            f"agent {named} does not build" if one else f"agents {named} do not build",
            "its factory" if one else "their factories",
        )
        raise SystemExit(1)
    for check in failing:
        logger.error(
            "agent %r is unavailable: its turns will dead-letter as agent_unavailable (%s)",
            check.name,
            check.error,
        )
    return checks


# Celery's loggers of the per-task "received" and "succeeded" lines (and a few more INFO ones:
# a rejected or retried task), each consulted once, when the consumer builds its task handlers.
_TASK_LINE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def quiet_task_lines() -> None:
    """Drop Celery's per-task INFO lines from this worker's log (AGENTJOBS_CELERY_TASK_LOGS=1
    keeps them): each goes through the formatter and the redaction filter, a measurable share
    of a short turn, and the turn's own events and status tell the same. Before the consumer
    starts: Celery asks these loggers whether INFO is on when it builds the task handlers."""
    for name in _TASK_LINE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def skip_result_repr(worker: Any) -> None:
    """Celery's trace renders every task's return value with saferepr, for the log's success
    line (whose value our format leaves out, tasks/queue/workarounds.py) and the
    `task-succeeded` event; for a turn's reply that walk costs about 0.1 ms, a few percent of
    a short turn. A worker that does not send task events at its start renders nothing (the
    turn's own record, events and Celery result hold the reply); one started with -E
    (worker_send_task_events) keeps Celery's length. Before the consumer starts: the tracer
    reads the length when the consumer builds it."""
    if worker.task_events:
        return
    for name in GUARDED_TASKS:
        task = worker.app.tasks.get(name)
        if task is not None:
            task.resultrepr_maxsize = 0


class PresenceStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """A worker bootstep: the heartbeat runs from the worker's start to its stop."""

    requires: ClassVar[set[str]] = {"celery.worker.components:Pool"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.presence: Presence | None = None

    def start(self, parent: Any) -> None:
        ctx = job_context()
        if not ctx.settings.celery_task_logs:
            quiet_task_lines()
        skip_result_repr(parent)
        # Its wake-ups in memory only (tasks/queue/broker.py): the pump wakes a dead worker's
        # prefetched turns from the beats this step writes, the rest from the time indices.
        hold_wakeups_in_memory(not ctx.settings.unacked_wakeups)
        announce_agents(ctx.settings.agents, strict=ctx.settings.strict_agents)
        slots = parent.concurrency if isinstance(parent.concurrency, int) else 0
        self.presence = Presence(ctx, parent.hostname, slots)
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
            record = ctx.records.get(held.turn_id, held.namespace)
            if record is not None and ending.hand_over(
                ctx, record, held.token, worker=worker, reason="grace_expired", patient=False
            ):
                handed.append(held.turn_id)
        except redis.RedisError as exc:  # its lease runs out and the pump wakes it
            logger.warning("could not hand over turn %s: %s", held.turn_id, exc)
    return handed


def wake_prefetched() -> int:
    """Wake the turns this process prefetched but has not started, for other workers now:
    Celery gives their messages back only once every running task has ended. A copy that
    comes back later is dropped by the turn record."""
    turns = prefetched_turns()
    for turn_id, namespace in turns:
        ending.wake(job_context(), turn_id, namespace or None)
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


# The tasks whose messages MessageGuardStep reads first, and resume_turn's parameters.
GUARDED_TASKS = ("tasks.run_turn", "tasks.resume_turn")
_RESUME_PARAMETERS = ("turn_id", "namespace", "agent", "conversation_id")
# What Celery's trace does with a body's embed: runs these lists, updates the request with it.
_EMBED_LISTS = ("callbacks", "errbacks", "chain")


_KINDS: dict[type, str] = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
}


def _kind(value: object) -> str:
    """What a decoded value is, in JSON's words, for a log line."""
    if value is None:
        return "null"
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def _shown(text: object, limit: int = 60) -> str:
    """A header value for a log line: printable ASCII, shortened (it may be anything)."""
    shown = "".join(c if " " <= c <= "~" else "?" for c in str(text))
    return repr(shown if len(shown) <= limit else shown[:limit] + "...")


def _embed_problem(embed: object) -> str:
    if embed is None:
        return ""
    if not isinstance(embed, Mapping) or not all(isinstance(k, str) for k in embed):
        return f"its embed is {_kind(embed)}, not an object"
    for key in _EMBED_LISTS:
        if not isinstance(embed.get(key), list | tuple | None):
            return f"its embed's {key} is {_kind(embed.get(key))}, not a list"
    if not isinstance(embed.get("chord"), Mapping | None):
        return f"its embed's chord is {_kind(embed.get('chord'))}, not an object"
    return ""


def _time_limit_problem(limits: object) -> str:
    if limits is None:
        return ""
    if isinstance(limits, list | tuple) and len(limits) == 2 and all(map(_seconds, limits)):
        return ""
    return "its timelimit header is not [hard, soft] seconds"


def _seconds(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _resume_problem(args: list[Any] | tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """What keeps (args, kwargs) from binding to resume_turn(turn_id, namespace, agent,
    conversation_id) with the types it takes, or ''."""
    if len(args) > len(_RESUME_PARAMETERS):
        return f"it has {len(args)} arguments, resume_turn takes {len(_RESUME_PARAMETERS)}"
    named = dict(zip(_RESUME_PARAMETERS, args, strict=False))
    for key, value in kwargs.items():
        if key not in _RESUME_PARAMETERS:
            return "it has a keyword argument resume_turn does not take"
        if key in named:
            return f"it gives {key} twice"
        named[key] = value
    if "turn_id" not in named:
        return "it has no turn_id"
    try:
        check_turn_id(named["turn_id"])
    except BadPayload as exc:
        return f"its turn_id {exc.problem}"
    if not isinstance(named.get("namespace"), str | None):
        return f"its namespace is {_kind(named.get('namespace'))}, not a string"
    for key in ("agent", "conversation_id"):
        if not isinstance(named.get(key, ""), str):
            return f"its {key} is {_kind(named.get(key))}, not a string"
    return ""


def unreadable(message: Any, task: str, accepted: frozenset[str] | set[str]) -> str:
    """What makes a broker message for `task` (one of GUARDED_TASKS) unreadable as the task's
    arguments, or '' when they can be read (they may still not be a turn: the task
    dead-letters those as bad_payload). Never quotes the body."""
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    content_type = message.content_type
    if content_type not in accepted:
        return (
            f"its content type {_shown(content_type)} is refused (ContentDisallowed); "
            f"accepted: {', '.join(sorted(accepted))}"
        )
    try:
        body = message.payload
    except Exception as exc:  # any error of decoding (DecodeError, a bad compression...)
        return f"its body cannot be decoded as {content_type} ({type(exc).__name__})"
    if isinstance(body, list | tuple):
        if len(body) != 3:
            return f"its body is a list of {len(body)}, not Celery's [args, kwargs, embed]"
        args, kwargs, embed = body
        fields: Mapping[str, Any] = headers
    elif isinstance(body, Mapping) and "args" in body:  # Celery's protocol 1
        args, kwargs = body.get("args"), body.get("kwargs", {})
        embed = {key: body.get(key) for key in ("callbacks", "errbacks", "chord")}
        fields = {**body, **headers}
    else:
        return f"its body is {_kind(body)}, not Celery's [args, kwargs, embed]"
    if "id" not in fields:
        return "it has no task id"
    try:
        check_turn_id(fields["id"])
    except BadPayload as exc:
        return f"its task id {exc.problem}"
    if not isinstance(args, list | tuple):
        return f"its args are {_kind(args)}, not a list"
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        return f"its kwargs are {_kind(kwargs)}, not an object"
    problem = _embed_problem(embed) or _time_limit_problem(fields.get("timelimit"))
    if not problem and task == "tasks.resume_turn":
        problem = _resume_problem(args, kwargs)
    return problem


def drop_unreadable(
    message: Any, task: str, problem: str, ack: Callable[..., Any], errors: tuple[type, ...]
) -> None:
    """Acknowledge an unreadable message, count it and log it in one line (no body)."""
    ack(logger, errors)
    turn_id = message.headers.get("id") if isinstance(message.headers, Mapping) else None
    try:
        named = f" for turn {check_turn_id(turn_id)}"
    except BadPayload:
        named = ""
    counted = ""
    try:
        ctx = job_context()
        ctx.redis.incr(ctx.keys.bad_messages)
    except redis.RedisError as exc:
        counted = f"; not counted, Redis unavailable ({exc})"
    logger.warning(
        "dropped a %s message%s: %s; acknowledged, not run (agentjobs_bad_messages_total)%s",
        task,
        named,
        problem,
        counted,
    )


def guard(strategy: Callable[..., Any], task: str, consumer: Any) -> Callable[..., Any]:
    """A task's message handler (Celery's strategy) that drops what it cannot read first."""
    accepted = frozenset(prepare_accept_content(consumer.app.conf.accept_content))  # type: ignore[no-untyped-call]

    def handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kw: Any) -> Any:
        problem = unreadable(message, task, accepted)
        if not problem:
            try:
                return strategy(message, body, ack, reject, callbacks, **kw)
            except (InvalidTaskError, ContentDisallowed, DecodeError) as exc:
                # A header Celery refuses (an eta, an expiry): its text may quote anything.
                problem = f"Celery cannot read it ({type(exc).__name__})"
        drop_unreadable(message, task, problem, ack, consumer.connection_errors)
        return None

    handle.agentjobs_guard = True  # type: ignore[attr-defined]
    return handle


class MessageGuardStep(bootsteps.Step):  # type: ignore[misc]
    """A consumer bootstep: the message handlers of GUARDED_TASKS read each message first and
    drop one they cannot read (see the module's docstring). Celery builds the handlers when
    the consumer starts or restarts and when the worker reloads; each time they are wrapped.
    Celery's own handling of an unreadable message logs its body (or exits), so this one
    acknowledges it before Celery sees it."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        update_strategies = parent.update_strategies

        def guarded_update() -> None:
            update_strategies()
            for name in GUARDED_TASKS:
                strategy = parent.strategies.get(name)
                if strategy is not None and not getattr(strategy, "agentjobs_guard", False):
                    parent.strategies[name] = guard(strategy, name, parent)

        parent.update_strategies = guarded_update


# Registered here rather than beside the worker steps (tasks/__init__.py): it belongs to the
# consumer, and only a worker process builds one.
app.steps["consumer"].add(MessageGuardStep)
