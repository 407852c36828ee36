"""The state store: where turn records, conversations, dead letters, events, journals (and
pauses) live, `AGENTJOBS_STATE_URL` (README.md, "Scaling out"), and the epoch that tells a store
that lost its data from a new one.

URL forms (parse_state_url):

    redis://[[user]:password@]host:port[/db]  one Redis (rediss:// for TLS, unix:// a socket)
    redis+cluster://[[user]:password@]host:port[,host:port...]
                                              a Redis Cluster: any reachable node finds the rest
    redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER_NAME[/db]
                                              the master of a Sentinel group; the user and
                                              password are the data nodes', the sentinels take none

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
  conversation as its turn 1 (tasks/turn/tasks.py). A message without a stamp (sent around
  run_turn.delay) keeps the old rule: registered from its kwargs, or ignored.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import quote, unquote, urlsplit

import orjson
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

logger = logging.getLogger("agentjobs.state")

# A Redis client of either kind: redis.Redis (one server, a Sentinel group's master) or
# RedisCluster. Both speak every command the job system sends (tasks/core/keys.py keeps each script
# in one slot, and multi-key reads use non-transactional pipelines, which a cluster splits).
StateClient: TypeAlias = redis.Redis | RedisCluster

CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
STATE_SCHEMES = (*PLAIN_SCHEMES, CLUSTER_SCHEME, SENTINEL_SCHEME)

# The Celery header each turn message carries: {"epoch": id, "sentAtMs": client clock}.
STAMP_HEADER = "agentjobs_state"
# How long a process trusts the epoch it read before reading it again (submissions stamp
# with it): bounds how long a client goes on stamping a lost store's epoch.
EPOCH_REFRESH_S = 5.0


class StateURLError(ValueError):
    """An AGENTJOBS_STATE_URL (or a broker/backend redis+sentinel:// URL) that cannot be used;
    the message names the variable and never quotes the URL (it may carry a password)."""

    code = "ERR_STATE_URL"


@dataclass(frozen=True)
class StateTarget:
    """A parsed state URL."""

    kind: str  # "redis", "cluster" or "sentinel"
    url: str  # for "redis": the URL as given, for redis.Redis.from_url
    nodes: tuple[tuple[str, int], ...] = ()  # cluster seeds, or the sentinels
    master_name: str = ""
    db: int = 0
    password: str | None = None
    # An ACL user of the data nodes; None: the default user.
    username: str | None = None

    def describe(self) -> str:
        """Where it points, for messages (no password)."""
        if self.kind == "redis":
            parts = urlsplit(self.url)
            if parts.scheme == "unix":
                return parts.path or "(a unix socket)"
            return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
        hosts = ",".join(f"{host}:{port}" for host, port in self.nodes)
        if self.kind == "cluster":
            return f"Redis Cluster {hosts}"
        return f"Sentinel master {self.master_name} via {hosts}"


def parse_state_url(url: str, variable: str = "AGENTJOBS_STATE_URL") -> StateTarget:
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in STATE_SCHEMES:
        kinds = ", ".join(f"{s}://" for s in STATE_SCHEMES)
        raise StateURLError(f"{variable} must be a {kinds} URL (value not shown)")
    if scheme in PLAIN_SCHEMES:
        return StateTarget("redis", url)
    credentials, at, location = rest.rpartition("@")
    username, password = _credentials(credentials) if at else (None, None)
    hosts, _, path = location.partition("/")
    nodes = _nodes(hosts, variable)
    if scheme == CLUSTER_SCHEME:
        if path.strip("/"):
            raise StateURLError(f"{variable}: a Redis Cluster has database 0 only: drop the /path")
        return StateTarget("cluster", url, nodes, password=password, username=username)
    segments = [unquote(s) for s in path.split("/") if s]
    if not segments or len(segments) > 2:
        raise StateURLError(
            f"{variable} must name the Sentinel master: redis+sentinel://host:port/MASTER_NAME[/db]"
        )
    db = segments[1] if len(segments) == 2 else "0"
    if not db.isdigit():
        raise StateURLError(f"{variable}: the database after the master name must be a number")
    return StateTarget("sentinel", url, nodes, segments[0], int(db), password, username)


def _credentials(credentials: str) -> tuple[str | None, str | None]:
    """(username, password) of "user:password", ":password" or "user", unquoted; None for a
    part left out (the default user, no password)."""
    username, _, password = credentials.partition(":")
    return (unquote(username) or None, unquote(password) or None)


def _nodes(hosts: str, variable: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for item in filter(None, (h.strip() for h in hosts.split(","))):
        host, colon, port = item.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StateURLError(f"{variable} must list host:port items (value not shown)")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise StateURLError(f"{variable} must list at least one host:port (value not shown)")
    return tuple(nodes)


def connect(target: StateTarget) -> StateClient:
    """A client for the state store, connecting lazily (the first command connects)."""
    common: dict[str, Any] = {"socket_keepalive": True, "health_check_interval": 30}
    if target.kind == "cluster":
        seeds = [ClusterNode(host, port) for host, port in target.nodes]  # type: ignore[no-untyped-call]
        return RedisCluster(
            startup_nodes=seeds, username=target.username, password=target.password, **common
        )
    if target.kind == "sentinel":
        sentinel = Sentinel(list(target.nodes), socket_timeout=5.0)  # type: ignore[no-untyped-call]
        master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            target.master_name,
            db=target.db,
            username=target.username,
            password=target.password,
            **common,
        )
        return master
    return redis.Redis.from_url(target.url, **common)


def celery_sentinel(url: str, variable: str) -> tuple[str, dict[str, Any]]:
    """A redis+sentinel:// broker or result backend URL in Celery's spelling: kombu's
    `sentinel://[user:password@]host:port;sentinel://...` with the master's name as a transport
    option. Any other URL comes back as it is."""
    if not url.lower().startswith(f"{SENTINEL_SCHEME}://"):
        return url, {}
    target = parse_state_url(url, variable)
    auth = ""
    if target.username or target.password:
        auth = f"{quote(target.username or '', safe='')}:{quote(target.password or '', safe='')}@"
    joined = ";".join(f"sentinel://{auth}{host}:{port}/{target.db}" for host, port in target.nodes)
    options: dict[str, Any] = {"master_name": target.master_name}
    if auth:
        # The credentials are the data nodes'; the sentinels are asked without them.
        options["sentinel_kwargs"] = {}
    return joined, options


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
