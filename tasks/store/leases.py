"""The lease keeper: one thread per process renews the conversation leases of every turn the
process is running (a thread per turn would cost more than a short turn itself).

It belongs to the process's JobContext. It starts with the first lease it holds and again
in a forked pool child (threads do not survive a fork), and `stop()` ends it.

It also carries the process's one piece of shutdown state: once `drain()` is called (the
worker was told to stop, tasks/turn/worker.py), every turn it runs hands its lease over at its
next check point (tasks/turn/checkpoints.py), and `held()` names the leases still held when the
grace runs out.
The flag lives here, not in a module global, because it is about exactly these leases.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis

from tasks.store.records import TurnRecords

logger = logging.getLogger("agentjobs.leases")

# Renewals per lease lifetime: a 10 s lease is renewed every 2.5 s, so two missed renewals
# (a slow Redis, a busy process) still leave it standing.
RENEWALS_PER_TTL = 4


@dataclass(frozen=True)
class HeldLease:
    turn_id: str
    namespace: str
    token: str


class LeaseKeeper:
    def __init__(self, records: TurnRecords, lease_ttl_s: float) -> None:
        self._records = records
        self._lease_ttl_s = lease_ttl_s
        self._lock = threading.Lock()
        # token -> (turn_id, namespace, called after each renewal that found the lease held)
        self._held: dict[str, tuple[str, str, Callable[[], None] | None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        # Set once, never cleared: a worker that began to shut down does not take turns again.
        self._draining = threading.Event()

    @property
    def interval_s(self) -> float:
        return self._lease_ttl_s / RENEWALS_PER_TTL

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        """From now on the turns of this process hand their leases over at their next check
        point. Only sets an event, so a signal handler may call it."""
        self._draining.set()

    def wait_for_drain(self, timeout_s: float | None = None) -> bool:
        return self._draining.wait(timeout_s)

    def held(self) -> list[HeldLease]:
        with self._lock:
            return [HeldLease(t, ns, token) for token, (t, ns, _) in self._held.items()]

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            if self._pid != os.getpid():  # a forked child: the parent's leases are not ours
                self._held.clear()
            self._pid = os.getpid()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    @contextlib.contextmanager
    def holding(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        on_renewed: Callable[[], None] | None = None,
    ) -> Iterator[None]:
        self.start()
        with self._lock:
            self._held[token] = (turn_id, namespace, on_renewed)
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(token, None)

    def _run(self) -> None:
        stop = self._stop
        while not stop.wait(self.interval_s):
            with self._lock:
                held = list(self._held.items())
            for token, (turn_id, namespace, on_renewed) in held:
                if self._renew(token, turn_id, namespace) and on_renewed is not None:
                    on_renewed()

    def _renew(self, token: str, turn_id: str, namespace: str) -> bool:
        try:
            if self._records.renew(turn_id, namespace, token, self._lease_ttl_s):
                return True
            with self._lock:
                self._held.pop(token, None)  # taken over: its writes will be refused
        except redis.RedisError as exc:
            logger.warning("lease renewal failed for turn %s: %s", turn_id, exc)
        return False
