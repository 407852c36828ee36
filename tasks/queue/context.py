"""One process's view of the job system: settings, the Redis client and the stores on it.

Built once per process on first use (workers, the pump, the CLI and clients all read the same
environment), so importing `tasks` never opens a connection.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import orjson
import redis
from redis.cluster import RedisCluster

from tasks.budgets.ledger import Ledger
from tasks.core.keys import Keys
from tasks.core.settings import Settings, load_settings
from tasks.core.state_url import parse_state_url
from tasks.queue.app import app
from tasks.store.client import StateClient, StateEpoch, connect
from tasks.store.conversations import ConversationStore
from tasks.store.dead_letters import DeadLetterStore
from tasks.store.leases import LeaseKeeper
from tasks.store.records import TurnRecords


@dataclass(frozen=True)
class JobContext:
    settings: Settings
    # The state store (AGENTJOBS_STATE_URL): one Redis, a Cluster, or a Sentinel group's master.
    redis: StateClient
    keys: Keys
    records: TurnRecords
    store: ConversationStore
    dead_letters: DeadLetterStore
    leases: LeaseKeeper
    epoch: StateEpoch
    # Provider budgets and tenant token caps (tasks/budgets/ledger.py), on the state store.
    ledger: Ledger
    # Whether a submission registers its turn and pushes its message in one script
    # (tasks/queue/broker.py, PublishFold): a Redis broker, a state store that is one plain
    # Redis, the fairness gate off (a turn it holds gets no message yet). The broker's server
    # is compared with the store's at the push.
    folds_publish: bool = False


def fairness_gate(settings: Settings, client: StateClient, keys: Keys) -> tuple[str, bytes]:
    """The tenant fairness gate's key tag and settings as the scripts take them
    (tasks/turn/fairness.py), or ('', b'') when it is off: by AGENTJOBS_TENANT_FAIRNESS=0, or
    on a Redis Cluster, where its keys would be in another slot than each script's."""
    if not settings.tenant_fairness or isinstance(client, RedisCluster):
        return "", b""
    weights, caps = settings.tenant_weights, settings.tenant_max_running
    default_cap = -1 if caps.default is None else caps.default
    config = {
        # cjson decodes an empty JSON object as an array: each map holds a key for that.
        "weights": {"": weights.default or 1, **weights.values},
        "dw": weights.default or 1,
        "caps": {"": default_cap, **caps.values},
        "dc": default_cap,
    }
    return keys.fair, orjson.dumps(config)


def build_context(settings: Settings) -> JobContext:
    client = connect(parse_state_url(settings.state_url))
    keys = Keys(settings.key_prefix, settings.index_shards)
    records = TurnRecords(client, keys, gate=fairness_gate(settings, client, keys))
    store = ConversationStore(client, keys)
    folds = (
        type(client) is redis.Redis
        and not records.gate[0]
        and app.connection_for_write().transport_cls in ("redis", "rediss")
    )
    return JobContext(
        settings=settings,
        redis=client,
        keys=keys,
        records=records,
        store=store,
        dead_letters=DeadLetterStore(client, records, settings.record_ttl_s),
        leases=LeaseKeeper(records, settings.lease_ttl_s),
        epoch=StateEpoch(client, keys.epoch, keys.epochs_lost),
        ledger=Ledger(client, keys),
        folds_publish=folds,
    )


@functools.cache
def job_context() -> JobContext:
    # celeryconfig.py's AGENTS, as the app loaded it, is the registry AGENTJOBS_AGENTS extends.
    return build_context(load_settings(registry=app.conf.get("AGENTS")))


def reset() -> None:
    """Forget this process's context and the secrets read with it, so the next use reads the
    environment again (tests that change it)."""
    from tasks.core.redact import process_secrets

    job_context.cache_clear()
    process_secrets.cache_clear()
