"""Celery configuration for agentjobs. Configuration only: every value comes from
Settings (tasks/core/settings.py), the one reader of the environment (README, "Settings"),
so REDIS_URL alone points the broker, the result backend and every store at one Redis, and a
key prefix alone keeps two deployments on one Redis apart. `AGENTS` below is yours to fill."""

import sys

from kombu import Exchange, Queue

from tasks.core.settings import SettingsError, load_settings
from tasks.core.state_url import celery_sentinel

# Agents by name: "name": "module:factory" (a factory takes no arguments and returns an
# agent.Agent; the module imports from the worker's working directory, as `celery -A` does).
# AGENTJOBS_AGENTS="name=module:factory,..." adds to these and wins.
AGENTS: dict[str, str] = {}

try:
    _settings = load_settings(registry=AGENTS)
except SettingsError as bad:
    # A worker (or any `celery` command) refuses to start with one line naming the variable;
    # a client importing tasks gets the typed error to handle.
    if sys.argv and any("celery" in part for part in sys.argv[0].split("/")[-2:]):
        sys.exit(f"agentjobs: {bad}")
    raise

# A redis+sentinel:// URL becomes Celery's sentinel:// spelling with the master's name as a
# transport option; RabbitMQ (amqp://) and plain Redis URLs pass as they are.
broker_url, broker_transport_options = celery_sentinel(_settings.broker_url, "CELERY_BROKER_URL")
result_backend, _backend_sentinel = celery_sentinel(
    _settings.result_backend, "CELERY_RESULT_BACKEND"
)
# Celery reads CELERY_BROKER_URL and CELERY_RESULT_BACKEND from the environment itself, and
# they win over broker_url and result_backend: a translated URL is given where it wins instead
# (the broker's read and write URLs; the backend through tasks/queue/app.py).
if broker_transport_options:
    broker_read_url = broker_write_url = broker_url
if _backend_sentinel:
    agentjobs_result_backend = result_backend
broker_connection_retry_on_startup = True

# JSON only, never pickle: orjson under its own content type, stdlib json still accepted.
task_serializer = "orjson"
result_serializer = "orjson"
accept_content = ["orjson", "json"]
result_accept_content = ["orjson", "json"]

# Results live as long as turn records, under the key prefix (another deployment's results,
# under its own prefix, never meet ours), without the extended fields nothing reads.
result_expires = _settings.record_ttl_s
result_backend_transport_options = {
    "global_keyprefix": f"{_settings.key_prefix}:",
    **_backend_sentinel,
}
result_extended = False

# Remote control (ping, inspect, mingle) and events on exchanges of our own, in JSON (the
# control replies are JSON: tasks/queue/app.py), so that any other Celery app on the same Redis
# neither hears our broadcasts nor chokes on our replies.
control_exchange = _settings.key_prefix
event_exchange = f"{_settings.key_prefix}.events"
event_serializer = "json"
# Task events cost a third of a short turn's throughput. Flower turns them on when it connects
# (or: celery -A tasks control enable_events).
worker_send_task_events = False
task_send_sent_event = False

# A message is acknowledged only when its task ends; a pool child that dies has its message
# redelivered (the job system counts deliveries, so this cannot loop forever).
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
worker_concurrency = _settings.worker_concurrency

# Submitted turns, and the wake-ups of retries, of the next turn of a conversation and of turns
# whose worker died. `celery -A tasks worker` consumes both.
task_queues = [
    Queue(name, Exchange(name), routing_key=name)
    for name in (_settings.turn_queue, _settings.retry_queue)
]
task_default_queue = _settings.turn_queue
task_routes = {"tasks.resume_turn": {"queue": _settings.retry_queue}}
