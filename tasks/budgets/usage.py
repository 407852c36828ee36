"""Tokens in and out per tenant, agent and model: written with the turn's ending (the succeed
script takes them, other endings add them in a script of their own), read by `agentjobs usage`.

Each shard keeps one hash per five minutes (ShardKeys.usage), fields "tenant US agent US model US
in|out" (US: the unit separator, which no tenant, agent or model name needs), and adds the same
tokens to its counters as "tokens US input|output US model US tenant" for `agentjobs metrics`.
A report reads every shard's hashes of the span asked for, in one pipelined round trip; a span
is counted in whole five-minute buckets, so `--since 1h` covers 60 to 65 minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tasks.core.keys import Keys
from tasks.core.schema import CounterName
from tasks.store.client import StateClient

BUCKET_MS = 5 * 60 * 1000
TTL_S = 8 * 24 * 3600
SEP = "\x1f"
DIRECTIONS = {"in": "input", "out": "output"}


@dataclass
class AttemptUsage:
    """The tokens one attempt's model calls reported, by model."""

    by_model: dict[str, list[int]] = field(default_factory=dict)

    def add(self, model: str, usage: Mapping[str, int] | None) -> tuple[int, int]:
        """Count a call's reported usage; -> (input, output) tokens."""
        if not usage:
            return 0, 0
        tokens_in = max(0, int(usage.get("inputTokens", 0) or 0))
        tokens_out = max(0, int(usage.get("outputTokens", 0) or 0))
        if tokens_in or tokens_out:
            counts = self.by_model.setdefault(model, [0, 0])
            counts[0] += tokens_in
            counts[1] += tokens_out
        return tokens_in, tokens_out

    def take_json(self, tenant: str | None, agent: str) -> bytes:
        """The counts as add_usage (common.lua) takes them, b"" when none; counted once."""
        rows: list[list[Any]] = []
        owner = tenant or ""
        for model, counts in self.by_model.items():
            for (short, direction), n in zip(DIRECTIONS.items(), counts, strict=True):
                if n:
                    usage_field = SEP.join((owner, agent, model, short))
                    counter = CounterName.TOKENS + SEP.join((direction, model, owner))
                    rows.append([usage_field, counter, n])
        self.by_model.clear()
        if not rows:
            return b""
        return orjson.dumps({"bucketMs": BUCKET_MS, "ttlS": TTL_S, "rows": rows})


@dataclass(frozen=True, slots=True)
class UsageRow:
    tenant: str  # "" for turns submitted without one
    agent: str
    model: str
    input_tokens: int
    output_tokens: int


def read_usage(
    client: StateClient, keys: Keys, since_ms: int, tenant: str | None = None
) -> list[UsageRow]:
    """Reported tokens of the last `since_ms` (whole buckets), per tenant, agent and model."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    first, last = (now_ms - since_ms) // BUCKET_MS, now_ms // BUCKET_MS
    with client.pipeline(transaction=False) as pipe:
        for shard in keys.all_shards():
            for bucket in range(first, last + 1):
                pipe.hgetall(shard.usage(bucket))
        found = pipe.execute()
    totals: dict[tuple[str, str, str], list[int]] = {}
    for counts in found:
        for raw_field, raw_n in counts.items():
            parts = raw_field.decode(errors="replace").split(SEP)
            if len(parts) != 4 or parts[3] not in DIRECTIONS:
                continue
            if tenant is not None and parts[0] != tenant:
                continue
            row = totals.setdefault((parts[0], parts[1], parts[2]), [0, 0])
            row[0 if parts[3] == "in" else 1] += int(raw_n)
    return [UsageRow(key[0], key[1], key[2], n[0], n[1]) for key, n in sorted(totals.items())]
