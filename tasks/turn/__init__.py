"""Running turns: the two Celery tasks (tasks), the door every turn is registered by
(registration), one delivery on a worker (delivery), one attempt of the agent with its check
points (attempt), the table from an attempt's end to an outcome (outcomes), and ending or
releasing a turn, the only place that does either (ending); the agent registry (registry),
the worker's steps for presence, hand-over and unreadable messages (worker), a turn's
streamed text coalesced into its events (tokens), and the pump that turns time into messages
(pump).

May import: tasks.core, tasks.store, tasks.budgets, tasks.queue, tasks.telemetry,
agent.
"""
