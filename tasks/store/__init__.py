"""The state store: turn records and their Lua scripts (records, lua/), the client and the
store's epoch (client), conversations (conversations), progress frames (progress), the tool
journal (journal), leases and the keeper that renews them (leases), dead-letter entries
(dead_letters) and what a paused turn waits for (pending). Every write that changes a turn's
state is one script, atomic in one hash slot. Nothing here knows Celery.

May import: tasks.core, agent.
"""
