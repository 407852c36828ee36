"""State store URLs (AGENTJOBS_STATE_URL, and the redis+sentinel:// spelling of the broker and
result backend URLs): parsed and checked without connecting.

    redis://[[user]:password@]host:port[/db]  one Redis (rediss:// for TLS, unix:// a socket)
    redis+cluster://[[user]:password@]host:port[,host:port...]
                                              a Redis Cluster: any reachable node finds the rest
    redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER_NAME[/db]
                                              the master of a Sentinel group; the user and
                                              password are the data nodes', the sentinels take none
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
STATE_SCHEMES = (*PLAIN_SCHEMES, CLUSTER_SCHEME, SENTINEL_SCHEME)


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
