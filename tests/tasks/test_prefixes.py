"""Two deployments with different key prefixes share one Redis database without meeting: their
queues, Celery results (which expire with AGENTJOBS_RECORD_TTL_S), remote control and job-system
keys all derive from the prefix."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tasks import app, load_conversation, run_turn
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

# What kombu's Redis transport keeps outside any name of ours: its delivery bookkeeping (a
# restored message goes back to its own exchange, so sharing these mixes nothing).
KOMBU_SHARED = {"unacked", "unacked_index", "unacked_mutex", "_kombu.binding_deadlines"}
# ... and the keys it names after an exchange (ours are named after the prefix).
KOMBU_BINDINGS = ("_kombu.binding.", "_kombu.binding_permanent.")

SUBMIT = (
    "from tasks import run_turn; "
    "r = run_turn.delay(agent='demo', conversation_id='c', message='from blue'); "
    "print(r.id, r.get(timeout=30)['content'])"
)


def test_two_prefixes_on_one_redis_never_meet(make_jobs: Any) -> None:
    # Given a deployment under the default prefix and one under "blue", one worker each,
    # logging Celery's line per task (which names the turn)
    jobs = make_jobs(AGENTJOBS_CELERY_TASK_LOGS="1")
    blue_env = {**jobs.env, "AGENTJOBS_KEY_PREFIX": "blue", "AGENTJOBS_RECORD_TTL_S": "900"}
    ours = jobs.worker()
    blue = jobs.worker(name="blue", env=blue_env)

    # When each submits a turn of a conversation with the same id
    reply = run_turn.delay(agent="demo", conversation_id="c", message="from default")
    submitted = subprocess.run(
        [sys.executable, "-c", SUBMIT],
        env=blue_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    # Then each turn ran on its own deployment's worker and stored its own conversation
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    blue_id, blue_answer = submitted.stdout.split(maxsplit=1)
    assert reply.get(timeout=30)["content"] == "Done: from default"
    assert blue_answer.strip() == "Done: from blue"
    assert reply.id in ours.log() and reply.id not in blue.log()
    assert blue_id in blue.log() and blue_id not in ours.log()
    stored = load_conversation("c")
    assert stored is not None and [m["content"] for m in stored.history] == [
        "from default",
        "Done: from default",
    ]
    # Each result under its own prefix, and every key under one of the two prefixes
    keys = {key.decode() for key in jobs.redis.scan_iter(count=1000)}
    assert f"agentjobs:celery-task-meta-{reply.id}" in keys
    assert f"blue:celery-task-meta-{blue_id}" in keys
    # which expires with the deployment's AGENTJOBS_RECORD_TTL_S
    assert 800 < jobs.redis.ttl(f"blue:celery-task-meta-{blue_id}") <= 900
    owned = {key for key in keys if _named(key).startswith(("agentjobs", "blue"))}
    assert keys - owned <= KOMBU_SHARED, keys - owned
    # And each deployment's remote control reaches its own workers only
    assert {name.split("@")[0] for r in app.control.ping(timeout=1) for name in r} == {"w1"}


def _named(key: str) -> str:
    for binding in KOMBU_BINDINGS:
        key = key.removeprefix(binding)
    return key.removeprefix("reply.")
