"""The README's first command: `agentjobs demo` (what `./dev demo` runs) against a Redis, as a
new user runs it: every turn's story told, every process it started stopped, nothing left
behind in a shared Redis, port 9808 taken by something else. It runs outside the source tree,
as from an installed package."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tasks.demo import demo_name, metrics_port_for
from tasks.testing import METRICS_PORT, RedisServer, free_port

pytestmark = pytest.mark.integration

# kombu's one key shared by every app on a Redis: binding table deadlines, by exchange name.
BINDING_DEADLINES = "_kombu.binding_deadlines"


@contextlib.contextmanager
def listening_on(port: int) -> Iterator[None]:
    """Something else listens on `port` meanwhile (already, or this socket)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # taken already: by someone else
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def test_the_demo_tells_four_turns_and_leaves_nothing_behind(
    redis_server: RedisServer, tmp_path: Any
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.set("someone-elses-key", "kept")
    # Another Celery app's binding deadline, due far ahead (kombu sweeps overdue ones)
    client.zadd(BINDING_DEADLINES, {"other-app.pidbox": 2**50})
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": redis_server.url, "HOME": str(tmp_path)}
    with listening_on(METRICS_PORT):
        done = subprocess.run(
            [sys.executable, "-m", "tasks.cli", "demo"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "Traceback" not in out + done.stderr
    assert "retrying in" in out and "HTTP 503" in out
    assert "flaky   result:" in out and "after 3 attempt(s)" in out
    assert "dead-lettered as dl-" in out and "non_resumable" in out
    # the dead letters as the operator's command prints them, run by the demo
    assert "as `agentjobs dlq list` shows it:" in out
    assert "1 entry." in out and "`agentjobs dlq show ID` shows one" in out
    # the fourth turn pauses for an approval, which the demo gives after a visible wait
    story = [line.split("] ", 1)[-1] for line in out.splitlines() if "refund " in line]
    paused = next(i for i, line in enumerate(story) if "needs a person's approval" in line)
    approved = next(i for i, line in enumerate(story) if "approved by the demo" in line)
    finished = next(i for i, line in enumerate(story) if line.startswith("refund  result:"))
    assert paused < approved < finished
    assert "stopped the worker, pump, metrics" in out
    # With port 9808 taken, its metrics exporter listened on another
    moved = re.search(rf"listens on port (\d+) \(port {METRICS_PORT} is in use\)", out)
    assert moved and int(moved[1]) != METRICS_PORT, out
    assert f"agentjobs metrics --port {moved[1]}\n" in out
    # Nothing of the demo's stays in a Redis it shares, not even its exchanges' entries in
    # kombu's shared key; what was there stays
    assert "entries in kombu's shared binding deadlines" in out and "its 0 entries" not in out
    assert set(client.scan_iter()) == {b"someone-elses-key", BINDING_DEADLINES.encode()}
    assert client.zrange(BINDING_DEADLINES, 0, -1) == [b"other-app.pidbox"]


def test_the_demo_moves_its_metrics_port_only_off_a_taken_one() -> None:
    port = free_port()
    assert metrics_port_for(None, default=port) == port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        moved = metrics_port_for(None, default=port)
        assert moved != port
        assert metrics_port_for(port, default=port) == port, "a port asked for is kept"


def test_the_demo_cleans_up_only_its_own_names() -> None:
    ours = demo_name("agentjobs-demo-12")
    for name in (
        "agentjobs-demo-12:{3}:turn:t-1",
        "agentjobs-demo-12:epoch",
        "agentjobs-demo-12.turns",
        "_kombu.binding.agentjobs-demo-12.turns",
        "reply.agentjobs-demo-12.pidbox",
        "_kombu.binding.agentjobs-demo-12",
    ):
        assert ours.search(name), name
    for name in ("agentjobs-demo-123:epoch", "_kombu.binding.agentjobs-demo-123.turns", "x-12"):
        assert not ours.search(name), name
