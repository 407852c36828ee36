"""Scale-out (docs/operations.md, "Scale-out"; README "Scaling out"): the job system's core
cases on each supported topology, every part real and on loopback:

    cluster    state on a three-master Redis Cluster (redis-cli --cluster create); broker and
               results on one Redis
    sentinel   state, broker and results on a Sentinel group (a master, a replica, three
               sentinels), with a failover while turns run
    rabbitmq   broker on RabbitMQ (a vhost of our own); state and results on one Redis, which
               is restarted without persistence to show a lost store is refused, not reused

Locally a missing RabbitMQ skips its topology with the reason; in CI (CI set) it fails.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import pools

from tasks import app, approve_action, load_conversation, run_turn, turn_status
from tasks.core.errors import TurnDeadLettered
from tasks.core.state_url import celery_sentinel
from tasks.operate.inspect import stats
from tasks.queue.context import job_context, reset
from tasks.store.records import TurnState
from tasks.testing import (
    Process,
    RabbitVhost,
    RedisClusterServers,
    RedisServer,
    SentinelGroup,
    start_pump,
    start_worker,
    wait_until,
)
from tasks.turn.ending import replay_dead_letter
from tests.tasks.conftest import configure_client, job_env

pytestmark = pytest.mark.integration

TOPOLOGIES = ("cluster", "sentinel", "rabbitmq")


@dataclass
class Topology:
    name: str
    redis_url: str  # REDIS_URL: the default of everything not set below
    overrides: dict[str, str]
    # What to flush between tests (the state and any Redis broker or backend).
    flush: list[redis.Redis | redis.RedisCluster] = field(default_factory=list)
    cluster: RedisClusterServers | None = None
    sentinel: SentinelGroup | None = None
    server: RedisServer | None = None
    vhost: RabbitVhost | None = None


def _missing(problem: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide this: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="module", params=TOPOLOGIES)
def topology(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[Topology]:
    workdir: Path = tmp_path_factory.mktemp(request.param)
    if request.param == "cluster":
        cluster = RedisClusterServers(workdir / "cluster").start()
        broker = RedisServer(workdir / "broker").start()
        seeds = redis.RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
        yield Topology(
            "cluster",
            broker.url,
            {"AGENTJOBS_STATE_URL": cluster.url},
            [seeds, redis.Redis.from_url(broker.url)],
            cluster=cluster,
            server=broker,
        )
        broker.stop()
        cluster.stop()
    elif request.param == "sentinel":
        group = SentinelGroup(workdir / "sentinel").start()
        url = group.url
        yield Topology(
            "sentinel",
            group.master.url if group.master is not None else "",
            {"AGENTJOBS_STATE_URL": url, "CELERY_BROKER_URL": url, "CELERY_RESULT_BACKEND": url},
            sentinel=group,
        )
        group.stop()
    else:
        problem = RabbitVhost.problem()
        if problem:
            _missing(problem)
        vhost = RabbitVhost().create()
        server = RedisServer(workdir / "state").start()
        yield Topology(
            "rabbitmq",
            server.url,
            {"CELERY_BROKER_URL": vhost.url},
            [redis.Redis.from_url(server.url)],
            server=server,
            vhost=vhost,
        )
        server.stop()
        vhost.delete()


def _reset_celery_client() -> None:
    # Celery caches its broker pool and result backend: forget them so the next use connects
    # to what app.conf says now.
    with suppress(Exception):
        pools.reset()  # closes and forgets every pooled connection and producer
    app._pool = None
    with suppress(KeyError):
        app.__dict__["amqp"]._producer_pool = None
    app._backend_cache = None
    app._local = threading.local()


@dataclass
class Scaled:
    topology: Topology
    env: dict[str, str]
    logdir: Path
    processes: list[Process] = field(default_factory=list)

    def worker(self, name: str = "w1", **options: Any) -> Process:
        process = start_worker(self.env, self.logdir, name=name, **options)
        self.processes.append(process)
        return process

    def pump(self) -> Process:
        process = start_pump(self.env, self.logdir)
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.processes)


@pytest.fixture
def scaled(topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scaled]:
    """One test's job system on the topology: clean stores, this process as its client."""
    env = job_env(topology.redis_url, **topology.overrides)
    for client in _flushable(topology):
        client.flushall()
    saved = {
        name: app.conf[name]
        for name in (
            "broker_url",
            "broker_read_url",
            "broker_write_url",
            "broker_transport_options",
            "result_backend",
            "result_backend_transport_options",
        )
    }
    configure_client(env, monkeypatch)
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        if name in env:
            monkeypatch.setenv(name, env[name])
        else:
            monkeypatch.delenv(name, raising=False)
    reset()
    settings = job_context().settings
    broker, broker_options = celery_sentinel(settings.broker_url, "CELERY_BROKER_URL")
    backend, backend_options = celery_sentinel(settings.result_backend, "CELERY_RESULT_BACKEND")
    _reset_celery_client()
    app.backend_cls = backend
    app.conf.update(
        broker_url=broker,
        broker_read_url=broker,
        broker_write_url=broker,
        broker_transport_options=broker_options,
        result_backend=backend,
        result_backend_transport_options={
            "global_keyprefix": f"{settings.key_prefix}:",
            **backend_options,
        },
    )
    if topology.vhost is not None:
        app.control.purge()  # messages a killed worker of an earlier test left unacked
    running = Scaled(topology, env, tmp_path / "logs")
    yield running
    for process in running.processes:
        process.stop()
    _reset_celery_client()
    app.backend_cls = None
    app.conf.update(saved)
    reset()


def _flushable(topology: Topology) -> list[Any]:
    if topology.sentinel is not None:
        return [redis.Redis(port=topology.sentinel.master_port())]
    return topology.flush


def _user_messages(conversation_id: str) -> list[str]:
    stored = load_conversation(conversation_id)
    assert stored is not None, f"no stored conversation {conversation_id}"
    return [m["content"] for m in stored.history if m["role"] == "user"]


def _tool_runs() -> dict[int, int]:
    """Executions of the demo tool per round, for the one slow turn of a test."""
    ctx = job_context()
    keys = list(ctx.redis.scan_iter(match=f"{ctx.keys.prefix}:demo:tool:*"))
    assert len(keys) == 1, keys
    return {int(k): int(v) for k, v in ctx.redis.hgetall(keys[0]).items()}


# --- The core cases, on every topology -------------------------------------------------------


def test_happy_turns_store_their_conversation(scaled: Scaled) -> None:
    scaled.worker()
    scaled.pump()
    first = run_turn.delay(agent="demo", conversation_id="c-1", message="hello rounds:2")
    assert first.get(timeout=30)["content"] == "Done: hello rounds:2"
    second = run_turn.delay(agent="demo", conversation_id="c-1", message="again")
    reply = second.get(timeout=30)
    assert reply["turnNumber"] == 2 and reply["attempts"] == 1
    assert _user_messages("c-1") == ["hello rounds:2", "again"]
    record = job_context().records.get(second.id)
    assert record is not None and record.state is TurnState.SUCCEEDED


def test_retry_resumes_after_resumable_failures(scaled: Scaled) -> None:
    scaled.worker()
    scaled.pump()
    result = run_turn.delay(agent="demo", conversation_id="c-r", message="hi fail:503x2")
    reply = result.get(timeout=45)
    assert reply["attempts"] == 3 and reply["content"] == "Done: hi fail:503x2"


def test_dead_letter_then_replay(scaled: Scaled) -> None:
    scaled.env["AGENTJOBS_MAX_ATTEMPTS"] = "2"
    scaled.worker()
    scaled.pump()
    result = run_turn.delay(agent="demo", conversation_id="c-d", message="m fail:503x2")
    with pytest.raises(TurnDeadLettered) as failed:
        result.get(timeout=45)
    assert failed.value.reason == "max_attempts"
    dead = job_context().dead_letters
    assert [e["id"] for e in dead.list_entries()] == [failed.value.entry_id]
    replayed = replay_dead_letter(job_context(), failed.value.entry_id)
    assert replayed.resumed_from_checkpoint
    reply = app.AsyncResult(replayed.turn_id).get(timeout=45)
    assert reply["content"] == "Done: m fail:503x2"
    assert dead.list_entries() == []
    assert _user_messages("c-d") == ["m fail:503x2"]


def test_order_holds_per_conversation_across_workers(scaled: Scaled) -> None:
    scaled.worker("w1", concurrency=4)
    scaled.worker("w2", concurrency=4)
    scaled.pump()
    conversations = [f"c-o{n}" for n in range(6)]
    results = {
        c: [run_turn.delay(agent="demo", conversation_id=c, message=f"{c} #{i}") for i in range(4)]
        for c in conversations
    }
    for c, turns in results.items():
        assert [r.get(timeout=60)["turnNumber"] for r in turns] == [1, 2, 3, 4]
        assert _user_messages(c) == [f"{c} #{i}" for i in range(4)]
    if scaled.topology.cluster is not None:
        # The conversations really are spread over the cluster's masters.
        holding = [
            n
            for n, server in enumerate(scaled.topology.cluster.servers)
            if any(True for _ in redis.Redis(port=server.port).scan_iter(match="*:turn:*"))
        ]
        assert len(holding) > 1, f"every turn record on one master: {holding}"


def test_sigkill_recovery_resumes_from_the_last_round(scaled: Scaled) -> None:
    victim = scaled.worker("w1")
    scaled.worker("w2")
    scaled.pump()
    result = run_turn.delay(agent="demo", conversation_id="c-k", message="go rounds:3 slow:1")
    turn_id = result.id

    def in_round_2() -> bool:
        record = job_context().records.get(turn_id)
        return record is not None and record.iteration == 2 and _tool_runs().get(2) == 1

    wait_until(in_round_2, 30, "round 1 persisted and round 2's tool running")
    record = job_context().records.get(turn_id)
    assert record is not None
    holder = victim if record.worker.startswith("w1@") else scaled.processes[1]
    holder.kill()
    reply = result.get(timeout=45)
    assert reply["content"] == "Done: go rounds:3 slow:1"
    runs = _tool_runs()
    assert runs[1] == 1, f"a persisted round ran again: {runs}"


def test_a_paused_turn_is_approved_and_resumes(scaled: Scaled) -> None:
    scaled.worker("w1")
    scaled.pump()
    result = run_turn.delay(agent="demo", conversation_id="c-p", message="refund:D-4 please")

    def pending() -> tuple[Any, ...]:
        status = turn_status(result.id)
        return status.pending if status is not None and status.state is TurnState.PAUSED else ()

    wait_until(lambda: bool(pending()), 30, "the turn to pause for approval")
    [action] = pending()
    assert action.tool == "refund_order"
    assert approve_action(result.id, action.request_id, actor="ops") is True
    assert result.get(timeout=45)["content"] == "Done: refund:D-4 please"
    assert approve_action(result.id, action.request_id, actor="ops") is False
    tools = [m for m in load_conversation("c-p").history if m["role"] == "tool"]  # type: ignore[union-attr]
    assert [m["toolName"] for m in tools] == ["refund_order"]


# --- Failures particular to a topology -------------------------------------------------------


def _get_through_failover(result: Any, timeout_s: float = 90) -> Any:
    """result.get(), retried while the result backend's Sentinel has no master to name (the
    seconds a failover lasts: redis' MasterNotFoundError, a ConnectionError), as a client would."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return result.get(timeout=max(1.0, deadline - time.monotonic()))
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.parametrize("topology", ["sentinel"], indirect=True)
def test_sentinel_failover_while_turns_run(scaled: Scaled) -> None:
    group = scaled.topology.sentinel
    assert group is not None and group.master is not None and group.replica is not None
    scaled.worker("w1", concurrency=4)
    scaled.pump()
    warm = run_turn.delay(agent="demo", conversation_id="c-f0", message="before")
    assert warm.get(timeout=30)["turnNumber"] == 1
    # Wait until the replica has everything, so that this failover loses nothing.
    replica = redis.Redis(port=group.replica.port)
    master = redis.Redis(port=group.master.port)
    wait_until(
        lambda: (
            replica.info("replication")["slave_repl_offset"]
            >= master.info("replication")["master_repl_offset"]
        ),
        10,
        "the replica to catch up",
    )
    results = [
        run_turn.delay(agent="demo", conversation_id=f"c-f{n}", message=f"t{n} rounds:2 slow:1")
        for n in range(1, 4)
    ]
    time.sleep(1.5)  # the turns are in their first tool round
    old_port = group.master.port
    killed_at = time.monotonic()
    group.master.kill()
    wait_until(lambda: group.master_port() != old_port, 30, "the sentinels to promote the replica")
    promoted_s = time.monotonic() - killed_at
    replies = [_get_through_failover(r) for r in results]
    recovered_s = time.monotonic() - killed_at
    assert [r["content"] for r in replies] == [f"Done: t{n} rounds:2 slow:1" for n in range(1, 4)]
    for n in range(1, 4):
        assert _user_messages(f"c-f{n}") == [f"t{n} rounds:2 slow:1"]
    print(f"\nsentinel failover: promoted {promoted_s:.1f} s, turns done {recovered_s:.1f} s")
    # The next test starts from a group whose master is the old replica: restore the pair.
    group.master, group.replica = group.replica, group.master
    group.replica.extra_args = ["--replicaof", "127.0.0.1", str(group.master.port)]
    group.replica.start()
    wait_until(group._sentinels_see_replica, 30, "the old master to rejoin as a replica")


@pytest.mark.parametrize("topology", ["rabbitmq"], indirect=True)
def test_a_store_restarted_empty_is_refused_not_reused(scaled: Scaled) -> None:
    # RabbitMQ as the broker: its messages outlive the state store.
    server = scaled.topology.server
    assert scaled.topology.vhost is not None and server is not None
    worker = scaled.worker()
    first = run_turn.delay(agent="demo", conversation_id="c-lost", message="turn one")
    assert first.get(timeout=30)["turnNumber"] == 1
    epoch_before = job_context().epoch.current()
    worker.stop()
    # Messages wait in RabbitMQ while the state store loses everything.
    second = run_turn.delay(agent="demo", conversation_id="c-lost", message="turn two")
    other = run_turn.delay(agent="demo", conversation_id="c-new", message="first of another")
    server.restart()  # no persistence: an empty Redis on the same port

    worker = scaled.worker("w2")
    for result in (second, other):
        with pytest.raises(TurnDeadLettered) as lost:
            result.get(timeout=30)
        assert lost.value.reason == "state_lost"
    # Nothing ran on the emptied conversation as its turn 1
    assert load_conversation("c-lost") is None and load_conversation("c-new") is None
    entries = job_context().dead_letters.list_entries(reason="state_lost", bodies=True)
    assert {e["taskId"] for e in entries} == {second.id, other.id}
    assert {e["kwargs"]["message"] for e in entries} == {"turn two", "first of another"}
    assert "the state store lost it" in worker.log()
    figures = stats(job_context())["state"]
    assert figures["lost"] and figures["stateLostTurns"] == 2
    assert figures["epoch"]["id"] != epoch_before
    # A new turn after the loss runs as usual, under the new epoch
    after = run_turn.delay(agent="demo", conversation_id="c-after", message="fresh")
    assert after.get(timeout=30)["turnNumber"] == 1


@pytest.mark.parametrize("topology", ["rabbitmq"], indirect=True)
def test_a_failover_that_lost_the_last_writes_is_refused(
    scaled: Scaled, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the state on a Sentinel group whose replica has everything but the last write (it
    # is stopped while a turn registers), and the turn's message safe in RabbitMQ
    group = SentinelGroup(tmp_path / "sentinel").start()
    try:
        assert group.master is not None and group.replica is not None
        scaled.env["AGENTJOBS_STATE_URL"] = group.url
        monkeypatch.setenv("AGENTJOBS_STATE_URL", group.url)
        reset()
        job_context().epoch.current()  # the epoch exists, and is replicated
        replica = redis.Redis(port=group.replica.port)
        wait_until(lambda: replica.exists(job_context().keys.epoch), 10, "the epoch replicated")
        replica_pid = group.replica.process.pid if group.replica.process else 0
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            # Cut the link too: what the master sent before stays in the stopped replica's
            # socket buffer and would still arrive; after this nothing does.
            redis.Redis(port=group.master.port).client_kill_filter(_type="replica")
            lost = run_turn.delay(agent="demo", conversation_id="c-fo", message="last write")
            group.master.kill()
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        old_port = group.master.port
        wait_until(lambda: group.master_port() != old_port, 30, "the replica promoted")

        # When a worker takes the message from the promoted replica's store
        worker = scaled.worker()

        # Then the turn is dead-lettered as state_lost, not run as if new
        with pytest.raises(TurnDeadLettered) as refused:
            lost.get(timeout=30)
        assert refused.value.reason == "state_lost"
        assert "writes were lost" in worker.log()
        assert load_conversation("c-fo") is None
    finally:
        for process in scaled.processes:  # before their state goes
            process.stop()
        group.stop()
