"""The state store: where turn records, conversations, dead letters, events, journals (and
pauses) live, `AGENTJOBS_STATE_URL` (README.md, "Scaling out"), and the epoch that tells a store
that lost its data from a new one.

Its URL forms are parsed in tasks/core/state_url.py; `connect` makes the client.

**The epoch.** A store holds one random id at `{prefix}:epoch`, created once (SET NX) by
whichever process first finds none, and never expiring. Every process reads it before it uses
the store and stamps every turn message it publishes with it (`STAMP_HEADER`: the epoch and the
publish time). Then:

- a process that knew epoch E and finds another, or none, knows the store lost its data (a Redis
  restarted without persistence, a flush): it logs an error and files the loss in
  `{prefix}:epoch:lost`, which `agentjobs stats` shows;
- a message whose turn record is missing while its stamp names another epoch, or names this
  one but is younger than a finished record's lifetime (the writes behind it were lost, as a
  Sentinel failover can lose the last ones), is a turn whose state was lost: it is
  dead-lettered as `state_lost` with what the message knows, instead of running on an empty
  conversation as its turn 1 (tasks/turn/delivery.py). A message without a stamp (sent around
  run_turn.delay) keeps the old rule: registered from its kwargs, or ignored.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import hiredis
import orjson
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError
from redis.sentinel import Sentinel

from tasks.core.state_url import StateTarget

logger = logging.getLogger("agentjobs.state")

# A Redis client of either kind: redis.Redis (one server, a Sentinel group's master) or
# RedisCluster. Both speak every command the job system sends (tasks/core/keys.py keeps each script
# in one slot, and multi-key reads use non-transactional pipelines, which a cluster splits).
StateClient: TypeAlias = redis.Redis | RedisCluster

# The Celery header each turn message carries: {"epoch": id, "sentAtMs": client clock}.
STAMP_HEADER = "agentjobs_state"
# How long a process trusts the epoch it read before reading it again (submissions stamp
# with it): bounds how long a client goes on stamping a lost store's epoch.
EPOCH_REFRESH_S = 5.0


class HiredisPacker:
    """Packs a command for the wire with hiredis alone (a connection's `command_packer`).

    redis-py 8 runs every argument through its Encoder in Python before handing the tuple to
    hiredis: a generator step, an isinstance chain and an encode call each, about 0.4 us, and
    a tool round's scripts send about 80 arguments (the register script 20 more). hiredis
    encodes str (as UTF-8), bytes, memoryview, int and float itself, to the same bytes. What
    it refuses (a bytearray, a bool, None...) goes to redis-py's own packer, which converts it
    or raises its DataError, as without this class. A command name with a space in it ("SCRIPT
    LOAD") is split into words, as redis-py does. For connections with redis-py's default
    encoding (UTF-8, strict), which `connect` makes."""

    def __init__(self) -> None:
        # redis-py's packing, as a connection with the default encoding does it (a Connection
        # object connects only when asked to).
        self._fallback = redis.Connection().pack_command  # type: ignore[no-untyped-call]

    def pack(self, *args: Any) -> list[bytes]:
        head = args[0]
        if (isinstance(head, str) and " " in head) or (isinstance(head, bytes) and b" " in head):
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            packed: list[bytes] = self._fallback(*args)  # type: ignore[no-untyped-call]
            return packed


def connect(target: StateTarget) -> StateClient:
    """A client for the state store, connecting lazily (the first command connects)."""
    common: dict[str, Any] = {"socket_keepalive": True, "health_check_interval": 30}
    if target.kind == "cluster":
        seeds = [ClusterNode(host, port) for host, port in target.nodes]  # type: ignore[no-untyped-call, unused-ignore]
        return RedisCluster(
            startup_nodes=seeds, username=target.username, password=target.password, **common
        )
    # (A Cluster's nodes take only the keyword arguments redis-py lists for them: the packer
    # is not among them. hiredis before 2.1 has no pack_command.)
    if hasattr(hiredis, "pack_command"):
        common["command_packer"] = HiredisPacker()
    if target.kind == "sentinel":
        sentinel = Sentinel(list(target.nodes), socket_timeout=5.0)  # type: ignore[no-untyped-call, unused-ignore]
        master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
            target.master_name,
            db=target.db,
            username=target.username,
            password=target.password,
            **common,
        )
        return master
    return redis.Redis.from_url(target.url, **common)


# Connection settings that make two Redis clients the same server, database and user.
_SAME_SERVER = ("host", "port", "path", "db", "username", "password")


def same_server(params: Mapping[str, Any], connection_class: type, client: Any) -> bool:
    """Whether a connection built from `params` (redis-py's connection keyword arguments, as
    a pool or Celery's backend holds them) with `connection_class` reaches the server,
    database and user of `client`, the state store's plain client (not a Cluster's, not a
    Sentinel master's, whose pool finds its server by asking), over the same kind of
    connection."""
    if type(client) is not redis.Redis:
        return False
    pool = client.connection_pool
    if type(pool) is not redis.ConnectionPool or pool.connection_class is not connection_class:
        return False
    ours = pool.connection_kwargs
    return all(_normal(ours, name) == _normal(params, name) for name in _SAME_SERVER)


def _normal(params: Mapping[str, Any], name: str) -> Any:
    value = params.get(name)
    if name == "db":
        return int(value or 0)
    if name == "port":
        return int(value or 6379) if params.get("path") is None else None
    return value or None


@dataclass(frozen=True)
class Loss:
    """A store found to have lost its data: the epoch known before, the one now."""

    lost_epoch: str
    epoch: str
    detected_at_ms: int
    detected_by: str
    how: str  # what noticed it

    def as_dict(self) -> dict[str, Any]:
        return {
            "lostEpoch": self.lost_epoch,
            "epoch": self.epoch,
            "detectedAtMs": self.detected_at_ms,
            "detectedBy": self.detected_by,
            "how": self.how,
        }


class StateEpoch:
    """The store's epoch as this process knows it (thread-safe)."""

    def __init__(self, client: StateClient, key: str, lost_key: str, *, who: str = "") -> None:
        self._redis = client
        self._key = key
        self._lost_key = lost_key
        self._who = who
        self._lock = threading.Lock()
        self._known: str | None = None
        self._read_at_s = 0.0  # monotonic

    def current(self) -> str:
        """The store's epoch, read again at most every EPOCH_REFRESH_S (created if missing)."""
        with self._lock:
            if self._known is None or time.monotonic() - self._read_at_s > EPOCH_REFRESH_S:
                self._refresh("a read of the epoch")
            assert self._known is not None
            return self._known

    def check(self, who: str = "") -> Loss | None:
        """Read the epoch now; a Loss when it changed (or vanished) since this process read it."""
        with self._lock:
            return self._refresh("the periodic epoch check", who)

    def stamp(self) -> dict[str, Any]:
        return {"epoch": self.current(), "sentAtMs": int(time.time() * 1000)}

    def _refresh(self, how: str, who: str = "") -> Loss | None:
        found = self._read_or_create()
        self._read_at_s = time.monotonic()
        previous, self._known = self._known, found
        if previous is None or previous == found:
            return None
        loss = Loss(previous, found, int(time.time() * 1000), who or self._who, how)
        self.file(loss)
        return loss

    def _read_or_create(self) -> str:
        raw = self._redis.get(self._key)
        if raw is None:
            fresh = orjson.dumps({"id": uuid.uuid4().hex, "createdAtMs": int(time.time() * 1000)})
            self._redis.set(self._key, fresh, nx=True)
            raw = self._redis.get(self._key)
        return str(orjson.loads(raw)["id"]) if raw else ""

    def message_from(self, stamped: str, who: str, turn_id: str) -> None:
        """A message stamped with another epoch than the store's: the store it was sent to
        lost its data (filed once per lost epoch, whoever notices first)."""
        current = self.current()
        if stamped and stamped != current:
            now_ms = int(time.time() * 1000)
            self.file(Loss(stamped, current, now_ms, who, f"a message of turn {turn_id}"))

    def file(self, loss: Loss) -> None:
        """Record a loss in the store and log it as an error, once per lost epoch."""
        first = self._redis.hsetnx(self._lost_key, loss.lost_epoch, orjson.dumps(loss.as_dict()))
        if not first:
            return
        logger.error(
            "STATE STORE LOST ITS DATA: epoch %s is gone, the store now holds epoch %s (noticed "
            "by %s, %s). Turns from before are gone: their messages are dead-lettered as "
            "state_lost. Was Redis restarted without persistence, flushed, or failed over?",
            loss.lost_epoch,
            loss.epoch,
            loss.detected_by or "this process",
            loss.how,
        )

    def info(self) -> dict[str, Any]:
        """The epoch and the losses on record, for `agentjobs stats`."""
        raw = self._redis.get(self._key)
        epoch = orjson.loads(raw) if raw else None
        lost: Mapping[Any, Any] = self._redis.hgetall(self._lost_key)
        losses = sorted(
            (orjson.loads(v) for v in lost.values()), key=lambda e: int(e["detectedAtMs"])
        )
        return {"epoch": epoch, "losses": losses}


def stamp_of(headers: Any) -> dict[str, Any] | None:
    """A message's stamp, from its headers (or the task request), or None."""
    if headers is None:
        return None
    found = headers.get(STAMP_HEADER) if hasattr(headers, "get") else None
    if isinstance(found, dict) and isinstance(found.get("epoch"), str):
        return found
    return None


def lost_state(stamp: Mapping[str, Any] | None, epoch: str, *, record_ttl_s: int) -> str:
    """Why a message whose turn record is missing is a turn whose state was lost, or '' when
    it is not (no stamp: an older or hand-made message; or a record that expired)."""
    if stamp is None:
        return ""
    stamped = str(stamp.get("epoch", ""))
    if stamped != epoch:
        return f"the store's epoch is {epoch}, this message was sent under epoch {stamped}"
    sent_at_ms = stamp.get("sentAtMs")
    age_s = time.time() - int(sent_at_ms) / 1000 if isinstance(sent_at_ms, int) else None
    if age_s is not None and age_s < record_ttl_s:
        return (
            f"the message was sent {age_s:.0f} s ago under this epoch, and its turn record "
            "(kept at least AGENTJOBS_RECORD_TTL_S) is gone: writes were lost (a failover?)"
        )
    return ""


class LuaScript:
    """A Lua script for one client (tasks/store/lua/, tasks/budgets/lua/): EVALSHA sent as a
    command of its own, and the script loaded when the server does not know it (a restart, a
    failover). redis-py's Script does the same after checking its client against a Protocol,
    about 5 us on each of a turn's three to five scripts."""

    def __init__(self, client: StateClient, source: str) -> None:
        self._client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        target = self._client if client is None else client
        try:
            return target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            target.script_load(self.source)
            return target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
