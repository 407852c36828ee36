"""Every Redis key the job system writes, with its lifetime. Nothing else names a key.

`prefix` defaults to "agentjobs" (setting AGENTJOBS_KEY_PREFIX), so two deployments, or two
test runs, can share one Redis without seeing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "agentjobs"

    def conversation(self, namespace: str) -> str:
        """String: the conversation envelope {format, data, savedAt}. Kept forever."""
        return f"{self.prefix}:conversation:{namespace}"

    def conversation_queue(self, namespace: str) -> str:
        """List of turn ids in submission order; the head is the one allowed to run. Emptied as
        turns end."""
        return f"{self.prefix}:convq:{namespace}"

    def lease(self, namespace: str) -> str:
        """String "turn_id|token": who runs the conversation now. Expires after lease_ttl_s
        unless the running worker's heartbeat renews it."""
        return f"{self.prefix}:lease:{namespace}"

    def turn(self, turn_id: str) -> str:
        """Hash: the turn record (state, attempt, deliveries, checkpoint, result...). Kept while
        the turn is active, then for record_ttl_s."""
        return f"{self.prefix}:turn:{turn_id}"

    @property
    def retries(self) -> str:
        """Sorted set turn_id -> due time (epoch ms): retries waiting out their backoff."""
        return f"{self.prefix}:retries"

    @property
    def running(self) -> str:
        """Sorted set turn_id -> lease expiry (epoch ms): turns a worker is running."""
        return f"{self.prefix}:running"

    @property
    def pending(self) -> str:
        """Sorted set turn_id -> last wake (epoch ms): queued turns not yet started."""
        return f"{self.prefix}:pending"

    @property
    def finished(self) -> str:
        """Sorted set turn_id -> end time (epoch ms): ended turns whose Celery result the pump
        has not yet confirmed (it writes the result again if the worker could not)."""
        return f"{self.prefix}:finished"

    @property
    def dead_letters(self) -> str:
        """Hash entry_id -> entry JSON: the dead-letter store. Kept until purged."""
        return f"{self.prefix}:dlq"

    @property
    def dead_letter_index(self) -> str:
        """Sorted set entry_id -> last failure time (epoch ms), for listing in order."""
        return f"{self.prefix}:dlq:index"

    def replay_marker(self, entry_id: str) -> str:
        """String: the turn id a dead-letter entry was replayed as. Kept for record_ttl_s, so
        a second replay finds the first one's job instead of starting another."""
        return f"{self.prefix}:dlq:replayed:{entry_id}"
