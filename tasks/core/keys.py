"""Every Redis key the job system writes, with its lifetime. Nothing else names a key.

Layout, ready for a Redis Cluster (docs/operations.md, "Scale out"):

    {prefix}:{<shard>}:...     everything one conversation touches, and the indices of its shard
    {prefix}:...               a few single-key values (replay markers, the worker presence hash,
                               the store's epoch, the count of unreadable messages)

A conversation belongs to one of `shards` shards (crc32 of its namespace). The `{<shard>}` hash
tag puts its envelope, queue, lease, turn records and its shard's indices (due retries, running
turns, queued turns, finished turns, dead letters) in one hash slot, so every Lua script touches
one slot. Keys still contain the namespace, so an operator finds a conversation by its id with
`SCAN MATCH '*c-42*'`. `prefix` defaults to "agentjobs" (AGENTJOBS_KEY_PREFIX): two deployments
with different prefixes share one Redis without seeing each other. Changing the shard count of a
live deployment moves every conversation to another slot: do it on an empty store only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one shard: its conversations, their turns, and the shard's indices."""

    prefix: str
    shard: int

    @property
    def tag(self) -> str:
        return f"{self.prefix}:{{{self.shard}}}"

    def conversation(self, namespace: str) -> str:
        """String: the conversation envelope {format, data, savedAt}, the stored conversation
        with `conversation_frames` on top (tasks/store/conversations.py). Kept forever."""
        return f"{self.tag}:conversation:{namespace}"

    def conversation_frames(self, namespace: str) -> str:
        """List: the turns since the envelope was last written whole, one progress frame each
        (tasks/store/progress.py) naming the envelope's savedAt it builds on. Appended at a
        turn's end; deleted whenever the envelope is written whole (a compaction)."""
        return f"{self.tag}:conversation-frames:{namespace}"

    def queue(self, namespace: str) -> str:
        """List of turn ids in submission order; the head is the one allowed to run. Emptied
        as turns end."""
        return f"{self.tag}:queue:{namespace}"

    def lease(self, namespace: str) -> str:
        """String: who runs the conversation now (encoded in tasks/store/lua/common.lua only).
        Expires after lease_ttl_s unless the running worker's lease keeper renews it."""
        return f"{self.tag}:lease:{namespace}"

    @property
    def turn_prefix(self) -> str:
        return f"{self.tag}:turn:"

    def turn(self, turn_id: str) -> str:
        """Hash: the turn record (tasks/store/records.py, TurnRecord). Kept while the turn is
        unfinished; then record_ttl_s, except a dead-lettered turn's, kept while its entry is."""
        return f"{self.turn_prefix}{turn_id}"

    def events(self, turn_id: str) -> str:
        """Stream: the turn's events (tasks/operate/events.py), written by the same scripts as the
        record changes they report. Kept as long as the turn record, but for its token.delta
        events: those go token_ttl_s after the turn ended (`tokens`)."""
        return f"{self.tag}:events:{turn_id}"

    @property
    def submitted(self) -> str:
        """Sorted set turn_id -> submission time (server epoch ms): every turn of the shard,
        entered by register, so that listings page through turns newest first without reading
        every record (tasks/operate/listing.py). An entry whose record has expired is dropped by
        the pump (trim_submitted) and skipped by readers until then."""
        return f"{self.tag}:submitted"

    @property
    def retries(self) -> str:
        """Sorted set turn_id -> due time (server epoch ms): retries waiting out their backoff."""
        return f"{self.tag}:retries"

    @property
    def running(self) -> str:
        """Sorted set turn_id -> lease expiry (server epoch ms): turns a worker is running."""
        return f"{self.tag}:running"

    @property
    def pending(self) -> str:
        """Sorted set turn_id -> last wake (server epoch ms): queued turns not yet started."""
        return f"{self.tag}:pending"

    @property
    def deadlines(self) -> str:
        """Sorted set turn_id -> deadline (server epoch ms): unfinished turns, by when they must
        have ended; the pump dead-letters a turn past it as deadline_exceeded."""
        return f"{self.tag}:deadlines"

    @property
    def pauses(self) -> str:
        """Sorted set turn_id -> pause expiry (server epoch ms): paused turns, waiting for a
        person; the pump dead-letters one past its expiry as pause_expired."""
        return f"{self.tag}:pauses"

    @property
    def finished(self) -> str:
        """Sorted set turn_id -> end time (server epoch ms): ended turns whose Celery result
        the pump has not yet confirmed (it writes the result again if the worker could not)."""
        return f"{self.tag}:finished"

    @property
    def tokens(self) -> str:
        """Sorted set turn_id -> when the pump looks at it (server epoch ms): turns that
        streamed, entered by their first token.delta; once a turn has ended token_ttl_s ago
        the pump removes its token.delta events (tasks/store/lua/drop_tokens.lua) and it."""
        return f"{self.tag}:tokens"

    @property
    def dead_letters(self) -> str:
        """Hash entry_id -> entry summary JSON (no checkpoint: that stays in the turn record).
        Kept until replayed or purged."""
        return f"{self.tag}:dlq"

    @property
    def counters(self) -> str:
        """Hash counter name -> count since the store began: what the shard's scripts did
        (finished:<state>, dead_lettered:<reason>, submitted, retries_scheduled, lease_takeovers,
        handovers), each counted in the script that did it (tasks/store/lua/common.lua, `count`).
        Kept forever; `agentjobs metrics` adds the shards up (tasks/operate/metrics.py). The scripts
        name it from the shard's turn key, as `{tag}:counters`."""
        return f"{self.tag}:counters"

    def usage(self, bucket: int) -> str:
        """Hash "tenant US agent US model US in|out" -> tokens the providers reported in one
        span of the shard's turns (tasks/budgets/usage.py: `bucket` is epoch ms // its span),
        for `agentjobs usage`. Kept eight days. The scripts name it from the shard's turn key,
        as `{tag}:usage:<bucket>` (common.lua, add_usage)."""
        return f"{self.tag}:usage:{bucket}"

    @property
    def dead_letter_index(self) -> str:
        """Sorted set entry_id -> last failure time (server epoch ms), for listing in order."""
        return f"{self.tag}:dlq:index"


@dataclass(frozen=True)
class LedgerKeys:
    """The keys of one shared ledger (tasks/budgets/ledger.py): a provider model's budget or a
    tenant's token cap. The hash tag holds the whole ledger in one slot, so each of its steps is
    one script in a Redis Cluster too. Each key expires a while after its last write (the
    longest window and then some), so a budget taken out of the settings leaves nothing."""

    tag: str

    @property
    def holds(self) -> str:
        """Sorted set call id -> hold expiry (server epoch ms): reservations not settled yet."""
        return f"{self.tag}:holds"

    @property
    def closed(self) -> str:
        """String: until when (server epoch ms) a provider's 429 closed the budget; expires then."""
        return f"{self.tag}:closed"

    @property
    def waiters(self) -> str:
        """Sorted set turn id -> when it is woken to try again: turns waiting for this budget,
        so that each is given its own turn as the window frees rather than all the same."""
        return f"{self.tag}:waiters"

    def log(self, limit: str) -> str:
        """Sorted set call id -> when it was settled (server epoch ms), for one limit
        (`kind/window`); an entry leaves once it is a window old."""
        return f"{self.tag}:{limit}:log"

    def amounts(self, limit: str) -> str:
        """Hash call id -> what the call counts against one limit (held or settled)."""
        return f"{self.tag}:{limit}:amounts"

    def total(self, limit: str) -> str:
        """String: the sum of `amounts`, kept by the scripts that change them."""
        return f"{self.tag}:{limit}:total"


@dataclass(frozen=True)
class Keys:
    prefix: str = "agentjobs"
    shards: int = 16

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError("AGENTJOBS_KEY_PREFIX must not contain '{' or '}' (hash tags)")
        if self.shards < 1:
            raise ValueError("AGENTJOBS_INDEX_SHARDS must be at least 1")

    def shard_of(self, namespace: str) -> int:
        return zlib.crc32(namespace.encode()) % self.shards

    def for_namespace(self, namespace: str) -> ShardKeys:
        return ShardKeys(self.prefix, self.shard_of(namespace))

    def shard(self, shard: int) -> ShardKeys:
        return ShardKeys(self.prefix, shard)

    def all_shards(self) -> list[ShardKeys]:
        return [ShardKeys(self.prefix, shard) for shard in range(self.shards)]

    def conversation(self, namespace: str) -> str:
        return self.for_namespace(namespace).conversation(namespace)

    def conversation_frames(self, namespace: str) -> str:
        return self.for_namespace(namespace).conversation_frames(namespace)

    def turn_id_owner(self, turn_id: str) -> str:
        """String: the namespace a turn id is being first registered for (TurnRecords.
        claim_turn_id), so two concurrent submissions of one id for two conversations agree
        on one. Kept 60 s: then the turn record itself says who owns the id."""
        return f"{self.prefix}:turn-id:{turn_id}"

    def replay_marker(self, entry_id: str) -> str:
        """String: the turn id a dead-letter entry was replayed as. Kept for record_ttl_s, so
        a second replay finds the first one's turn instead of starting another."""
        return f"{self.prefix}:dlq:replayed:{entry_id}"

    def budget(self, name: str) -> LedgerKeys:
        """A provider model's shared budget, `name` as "provider:model" (AGENTJOBS_BUDGETS)."""
        return LedgerKeys(f"{{{self.prefix}:budget:{name}}}")

    @property
    def fair(self) -> str:
        """The tenant fairness gate's key tag (tasks/turn/fairness.py): its keys are
        `{tag}:unclaimed`, `:owners`, `:keys`, `:inflight`, `:active`, `:held:<tenant>` and
        `:window`, named by the scripts (tasks/store/lua/common.lua, the gate functions). The
        held lists are kept until their turns are released; the rest while turns run."""
        return f"{{{self.prefix}:fair}}"

    def tenant_tokens(self, tenant: str) -> LedgerKeys:
        """A tenant's reported token usage for its cap (AGENTJOBS_TENANT_TOKEN_LIMIT)."""
        return LedgerKeys(f"{{{self.prefix}:tenant-tokens:{tenant}}}")

    @property
    def workers(self) -> str:
        """Hash worker name -> JSON {at, received}: each worker's last heartbeat (server epoch
        ms) and the turns it holds prefetched but not started. The pump wakes the received
        turns of a worker whose heartbeat stopped, and removes it."""
        return f"{self.prefix}:workers"

    @property
    def pump_heartbeat(self) -> str:
        """String: the server time (epoch ms) of the last pump tick that completed, any pump's.
        Kept record_ttl_s, so `agentjobs stats` can tell how long ago a pump last ran."""
        return f"{self.prefix}:pump:heartbeat"

    @property
    def epoch(self) -> str:
        """String: JSON {id, createdAtMs}, the store's epoch (store/client.py), created once by
        the first process that finds none. Kept forever: a store without it lost its data."""
        return f"{self.prefix}:epoch"

    @property
    def unreadable_records(self) -> str:
        """Set of turn keys found unreadable by a sweep (tasks/store/records.py, note_unreadable),
        for `agentjobs stats`; a key that was removed or repaired is dropped by the next
        `stats`. Kept forever."""
        return f"{self.prefix}:unreadable"

    @property
    def bad_messages(self) -> str:
        """String: how many broker messages for our tasks a worker dropped because their body
        could not be read as the task's arguments (tasks/turn/worker.py, MessageGuardStep), for
        `agentjobs metrics`. Kept forever."""
        return f"{self.prefix}:bad-messages"

    @property
    def epochs_lost(self) -> str:
        """Hash lost epoch id -> JSON of how the loss was noticed (tasks/store/client.py, Loss), for
        `agentjobs stats`. Kept forever: it is the record that turns were lost."""
        return f"{self.prefix}:epoch:lost"
