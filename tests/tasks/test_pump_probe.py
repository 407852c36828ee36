"""The pump's probe (tasks/store/lua/due_probe.lua, TurnRecords.due_indices): each tick asks
every time index of every shard, in one script per Redis node, whether something is due by the
server's clock less the index's lag, and takes (take_due) from those alone. It must find each
kind in every shard, on one Redis and on a Cluster, agree with take_due on what is due, miss
nothing that falls due between two probes, and leave an idle tick without a take_due."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis

from tasks.core.keys import Keys, ShardKeys
from tasks.core.settings import load_settings
from tasks.queue.context import JobContext, build_context
from tasks.store.records import TurnRecords
from tasks.testing import RedisClusterServers, RedisServer, start_pump, wait_until
from tasks.turn import ending, pump
from tests.tasks.conftest import job_env

pytestmark = pytest.mark.integration
STALL_MS = 3000
GRACE_MS = 1000
KINDS = ("retries", "running", "pending", "deadlines", "pauses", "finished")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server of this module's own: its command counts are this module's."""
    own = RedisServer(tmp_path_factory.mktemp("probe-redis")).start()
    yield own
    own.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(server.url)
    connection.flushall()
    yield connection
    connection.close()


def context(url: str, shards: int = 16) -> JobContext:
    """A job context of this process on the store at `url` (one Redis, or a Cluster's)."""
    settings = load_settings(
        {
            "AGENTJOBS_STATE_URL": url,
            "AGENTJOBS_KEY_PREFIX": "probe",
            "AGENTJOBS_INDEX_SHARDS": str(shards),
            "AGENTJOBS_STALL_AFTER_S": str(STALL_MS / 1000),
            "AGENTJOBS_RESULT_GRACE_S": str(GRACE_MS / 1000),
        }
    )
    return build_context(settings)


def server_ms(client: redis.Redis | redis.RedisCluster) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def add_due(client: Any, shard: ShardKeys, kind: str, now_ms: int, *, late_ms: int = 1) -> str:
    """A member of `shard`'s `kind` index due `late_ms` ago (counting the kind's lag)."""
    key = str(getattr(shard, kind))
    lag = {"pending": STALL_MS, "finished": GRACE_MS}.get(kind, 0)
    client.zadd(key, {f"t-{shard.shard}-{kind}": now_ms - lag - late_ms})
    return key


def every_index(ctx: JobContext) -> list[tuple[ShardKeys, str]]:
    """Each time index the pump asks about, with its shard: every kind, every shard."""
    indices = pump.time_indices(ctx)
    found = [
        (shard, key)
        for shard in ctx.keys.all_shards()
        for key in indices
        if key.startswith(f"{shard.tag}:")
    ]
    assert len(found) == len(indices) and len(indices) >= len(KINDS) * ctx.keys.shards
    return found


def add_every_due(client: Any, ctx: JobContext, now_ms: int, *, late_ms: int = 1) -> set[str]:
    """A member due `late_ms` ago (counting its lag) in every index the pump asks about."""
    for shard, key in every_index(ctx):
        lag = pump.time_indices(ctx)[key]
        client.zadd(key, {f"t-{shard.shard}": now_ms - lag - late_ms})
    return set(pump.time_indices(ctx))


def evalsha_calls(client: redis.Redis) -> int:
    stats: Mapping[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


class Spied:
    """The take_due calls of one context's records, by index key."""

    def __init__(self, records: TurnRecords, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken_from: list[str] = []
        take_due = records.take_due

        def spy(shard: ShardKeys, index_key: str, **options: int) -> Any:
            self.taken_from.append(index_key)
            return take_due(shard, index_key, **options)

        monkeypatch.setattr(records, "take_due", spy)


class NoBacklog(pump.BrokerBacklog):
    """A broker that holds nothing, so stalled candidates are handled without asking one."""

    def __init__(self) -> None:
        super().__init__(())

    def messages_waiting(self) -> bool:
        return False


@pytest.fixture
def woken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the pump would publish or write, kept here instead (no broker, no result backend)."""
    calls: list[str] = []
    monkeypatch.setattr(ending, "wake", lambda ctx, turn_id, *a, **kw: calls.append(turn_id))
    monkeypatch.setattr(pump, "has_final_result", lambda turn_id: True)
    return calls


# -- one Redis ----------------------------------------------------------------------------------


def test_the_probe_finds_each_kind_due_in_every_shard(
    client: redis.Redis, server: RedisServer
) -> None:
    # Given one due member in each index of each shard (16 shards: 16 slots)
    ctx = context(server.url)
    added = add_every_due(client, ctx, server_ms(client))
    # When the pump probes
    due = ctx.records.due_indices(pump.time_indices(ctx))
    # Then every one of them is due, in one script call
    assert due == added


def test_the_probe_and_take_due_agree_on_what_is_due(
    client: redis.Redis, server: RedisServer
) -> None:
    ctx = context(server.url, shards=4)
    shards = ctx.keys.all_shards()
    now = server_ms(client)
    # Given, per kind, a shard with a member due a while ago, one with a member not due for a
    # while (the lag of pending and finished counted), and one empty
    due_keys = {add_due(client, shards[0], kind, now, late_ms=2000) for kind in KINDS}
    waiting = {add_due(client, shards[1], kind, now, late_ms=-5000) for kind in KINDS}
    # When the pump probes, and take_due is asked of every index
    lags = pump.time_indices(ctx)
    due = ctx.records.due_indices(lags)
    taken = {
        key
        for shard, key in every_index(ctx)
        if ctx.records.take_due(shard, key, limit=1, bump_ms=60_000, lag_ms=lags[key])
    }
    # Then both say the same: the due ones, not the waiting ones nor the empty indices
    assert due == taken == due_keys
    assert not waiting & due
    # And what take_due took was pushed back: the probe sees nothing due now
    assert ctx.records.due_indices(lags) == set()


def test_an_entry_that_falls_due_between_probes_is_found_by_the_next(
    client: redis.Redis, server: RedisServer
) -> None:
    ctx = context(server.url)
    shard = ctx.keys.shard(7)
    indices = pump.time_indices(ctx)
    # Given a retry due 300 ms from now, by the server's clock
    due_at = server_ms(client) + 300
    client.zadd(shard.retries, {"t-soon": due_at})
    # When the pump probes before and after
    assert ctx.records.due_indices(indices) == set()
    wait_until(lambda: server_ms(client) > due_at, 5, "the retry to fall due")
    # Then the next probe has it
    assert ctx.records.due_indices(indices) == {shard.retries}


def test_idle_ticks_run_the_probe_alone(
    client: redis.Redis, server: RedisServer, monkeypatch: pytest.MonkeyPatch, woken: list[str]
) -> None:
    ctx = context(server.url, shards=64)
    spied = Spied(ctx.records, monkeypatch)
    # Given indices that hold members, none due
    add_every_due(client, ctx, server_ms(client), late_ms=-60_000)
    # When the pump ticks ten times
    before = evalsha_calls(client)
    for _ in range(10):
        assert not pump.pump_once(ctx, NoBacklog())
    # Then it ran one script a tick (the probe) and no take_due, with 64 shards
    assert spied.taken_from == []
    assert evalsha_calls(client) - before == 10
    assert woken == []


def test_a_tick_takes_from_the_due_indices_alone(
    client: redis.Redis, server: RedisServer, monkeypatch: pytest.MonkeyPatch, woken: list[str]
) -> None:
    ctx = context(server.url)
    spied = Spied(ctx.records, monkeypatch)
    shards = ctx.keys.all_shards()
    now = server_ms(client)
    # Given each kind due in another shard (members without records: the sweeps drop them)
    due_keys = [add_due(client, shards[2 * n + 1], kind, now) for n, kind in enumerate(KINDS)]
    # When the pump ticks
    tick = pump.pump_once(ctx, NoBacklog())
    # Then it took from those six indices, in the order it always swept them, and handled each
    assert sorted(spied.taken_from) == sorted(due_keys)
    assert woken == ["t-1-retries"]  # the retry is woken; the rest had no record
    assert tick.retries == 1
    for key in due_keys:
        if not key.endswith(":retries"):
            assert client.zcard(key) == 0, key


def test_the_pump_without_the_probe_takes_from_every_index(
    client: redis.Redis, server: RedisServer, monkeypatch: pytest.MonkeyPatch, woken: list[str]
) -> None:
    ctx = context(server.url, shards=4)
    spied = Spied(ctx.records, monkeypatch)
    pump.pump_once(ctx, NoBacklog(), probe=False)
    assert sorted(spied.taken_from) == sorted(pump.time_indices(ctx))


# -- a real pump process ------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [16, 64])
def test_an_idle_pump_process_runs_one_script_a_tick(
    client: redis.Redis, server: RedisServer, tmp_path: Path, shards: int
) -> None:
    env = job_env(server.url, AGENTJOBS_INDEX_SHARDS=str(shards), AGENTJOBS_PUMP_INTERVAL_S="0.1")
    process = start_pump(env, tmp_path / "logs")
    try:
        time.sleep(0.5)  # its first ticks loaded the script
        stats: Mapping[str, Any] = client.info("commandstats")
        before = {
            name: int(stats.get(name, {}).get("calls", 0))
            for name in ("cmdstat_evalsha", "cmdstat_set")
        }
        time.sleep(1.5)
        stats = client.info("commandstats")
        after = {name: int(stats.get(name, {}).get("calls", 0)) for name in before}
    finally:
        process.stop()
    ticks = after["cmdstat_set"] - before["cmdstat_set"]  # its heartbeat, once a tick
    scripts = after["cmdstat_evalsha"] - before["cmdstat_evalsha"]
    assert ticks >= 5
    assert ticks - 1 <= scripts <= ticks + 1


def test_a_pump_process_ends_what_falls_due_in_every_shard(
    client: redis.Redis, server: RedisServer, tmp_path: Path
) -> None:
    keys = Keys("agentjobs", 16)
    env = job_env(server.url, AGENTJOBS_PUMP_INTERVAL_S="0.1")
    process = start_pump(env, tmp_path / "logs")
    try:
        # Given a ticking pump, and deadlines (of turns without records) falling due 600 ms
        # from now in every shard
        due_at = server_ms(client) + 600
        for shard in keys.all_shards():
            client.zadd(shard.deadlines, {f"gone-{shard.shard}": due_at})
        # When they fall due, between two of its probes
        time.sleep(0.3)
        assert all(client.zcard(s.deadlines) == 1 for s in keys.all_shards())
        # Then the pump's next probes find every one, and the sweeps drop them
        wait_until(
            lambda: all(client.zcard(s.deadlines) == 0 for s in keys.all_shards()),
            5,
            "the pump to sweep every shard's deadlines",
        )
    finally:
        process.stop()
    assert server_ms(client) >= due_at


# -- a Redis Cluster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("probe-cluster")).start()
    yield servers
    servers.stop()


@pytest.fixture
def cluster_ctx(cluster: RedisClusterServers) -> Iterator[JobContext]:
    ctx = context(cluster.url)
    ctx.redis.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    yield ctx
    ctx.redis.close()


def node_evalsha(cluster: RedisClusterServers) -> list[int]:
    return [evalsha_calls(redis.Redis(port=s.port)) for s in cluster.servers]


def test_on_a_cluster_the_probe_finds_each_kind_due_in_every_shard(
    cluster: RedisClusterServers, cluster_ctx: JobContext
) -> None:
    # Given one due member in each index of each of 16 shards, spread over three masters
    ctx = cluster_ctx
    added = add_every_due(ctx.redis, ctx, server_ms(ctx.redis))
    nodes = {ctx.redis.get_node_from_key(key).name for key in added}  # type: ignore[union-attr]
    assert len(nodes) == 3
    indices = pump.time_indices(ctx)
    ctx.records.due_indices(indices)  # loads the script on each node
    # When the pump probes
    before = node_evalsha(cluster)
    due = ctx.records.due_indices(indices)
    # Then every one is due, found by one script on each node
    assert due == added
    assert [a - b for a, b in zip(node_evalsha(cluster), before, strict=True)] == [1, 1, 1]
    # And once taken, nothing is
    for shard, key in every_index(ctx):
        assert ctx.records.take_due(shard, key, limit=5, bump_ms=60_000, lag_ms=indices[key])
    assert ctx.records.due_indices(indices) == set()


def test_on_a_cluster_a_node_whose_probe_fails_is_swept_as_before(
    cluster_ctx: JobContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a node that refuses the probe (its slots moving, an old Redis), nothing due anywhere
    ctx = cluster_ctx
    failing = ctx.redis.get_node_from_key(ctx.keys.shard(0).retries).name  # type: ignore[union-attr]
    probe = ctx.records._probe

    def refusing(pairs: Any, client: Any = None) -> set[str]:
        port = client.get_connection_kwargs()["port"]
        if failing.endswith(f":{port}"):
            raise redis.ResponseError("Script attempted to access a non local key")
        return probe(pairs, client)

    monkeypatch.setattr(ctx.records, "_probe", refusing)
    # When the pump probes
    due = ctx.records.due_indices(pump.time_indices(ctx))
    # Then the failing node's indices, and only those, are reported due: take_due sweeps them
    expected = {k for k in pump.time_indices(ctx) if ctx.redis.get_node_from_key(k).name == failing}  # type: ignore[union-attr]
    assert due == expected and 0 < len(due) < len(pump.time_indices(ctx))


def test_the_probe_refuses_a_key_it_could_not_pack(
    client: redis.Redis, server: RedisServer
) -> None:
    # Its indices go in one space-separated argument (AGENTJOBS_KEY_PREFIX allows no spaces)
    with pytest.raises(ValueError, match="whitespace"):
        context(server.url).records.due_indices({"odd prefix:{0}:retries": 0})
