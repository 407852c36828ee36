"""Operating turns from outside a worker, the calls behind the public API and the CLI:
cancel (control), a person's decisions (people), a turn's status (status), its event stream
(events), listings and counts over the store (inspect), and the Prometheus exporter
(metrics). Whatever ends a turn goes through tasks.turn.ending.

May import: tasks.core, tasks.store, tasks.queue, tasks.telemetry, tasks.turn, agent.
"""
