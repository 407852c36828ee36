"""Celery configuration for agentjobs. Configuration only: every value can be set from the
environment, and REDIS_URL alone points the broker, the result backend and every store at one
Redis. The job system's own settings (AGENTJOBS_*) are read in tasks/settings.py."""

import os

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

broker_url = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
result_backend = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL)
broker_connection_retry_on_startup = True

# JSON only, never pickle: orjson under its own content type, stdlib json still accepted.
task_serializer = "orjson"
result_serializer = "orjson"
accept_content = ["orjson", "json"]
result_accept_content = ["orjson", "json"]
# Flower and other event consumers read JSON.
event_serializer = "json"
worker_send_task_events = True
task_send_sent_event = True
result_extended = True
result_expires = 7 * 24 * 3600

# A message is acknowledged only when its task ends; a pool child that dies has its message
# redelivered (the job system counts deliveries, so this cannot loop forever).
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1

# Submitted turns, and the wake-ups of retries, of the next turn of a conversation and of turns
# whose worker died. A worker consumes both.
task_default_queue = os.environ.get("AGENTJOBS_TURN_QUEUE", "agentjobs.turns")
task_routes = {
    "tasks.resume_turn": {"queue": os.environ.get("AGENTJOBS_RETRY_QUEUE", "agentjobs.retry")}
}

# Agents by name: "name": "module:factory" (a factory takes no arguments and returns an Agent).
# AGENTJOBS_AGENTS="name=module:factory,..." adds to these.
AGENTS = {
    "demo": "tasks.demo_agents:build_demo_agent",
}
