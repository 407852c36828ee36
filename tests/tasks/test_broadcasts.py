"""Remote control on an exchange of our own, in JSON: a plain Celery app's worker on the same
Redis, mingle on, neither meets our workers' broadcasts nor chokes on their replies (before, it
exited at start with ContentDisallowed('... application/x-orjson') from its mingle hello)."""

from __future__ import annotations

from typing import Any

import pytest

from tasks import app
from tasks.testing import wait_until
from tests.tasks.plain_celery_app import make_app

pytestmark = pytest.mark.integration

PLAIN = "tests.tasks.plain_celery_app"


def pinged(replies: list[dict[str, Any]] | None) -> set[str]:
    return {name.split("@")[0] for reply in replies or [] for name in reply}


def test_a_plain_celery_worker_beside_ours_stays_up_and_answers(make_jobs: Any) -> None:
    # Given our worker and a plain Celery app's worker on the same Redis db, both with mingle
    jobs = make_jobs()
    ours = jobs.worker(mingle=True)
    plain = jobs.worker(name="plain", app=PLAIN, mingle=True)
    # When each side pings its own workers
    plain_app = make_app(jobs.env["REDIS_URL"])
    plain_replies = plain_app.control.ping(timeout=1)
    our_replies = app.control.ping(timeout=1)
    # Then the plain worker is up and answers its app, ours answers ours, neither the other
    assert plain.alive(), plain.log()[-3000:]
    assert "ContentDisallowed" not in plain.log()
    assert pinged(plain_replies) == {"plain"}
    assert pinged(our_replies) == {"w1"}
    assert ours.alive()


def test_our_control_replies_are_json(make_jobs: Any) -> None:
    # Given a plain Celery worker (JSON only) on our control exchange, beside our worker
    jobs = make_jobs()
    jobs.worker(mingle=True)
    exchange = str(app.conf.control_exchange)
    plain = jobs.worker(
        name="plain", app=PLAIN, mingle=True, env={"PLAIN_CONTROL_EXCHANGE": exchange}
    )
    # Then its mingle hello read our worker's reply, and it reads our pings' replies too
    wait_until(lambda: "mingle: sync with 1 nodes" in plain.log(), 10, "the plain worker's mingle")
    assert plain.alive() and "ContentDisallowed" not in plain.log()
    assert pinged(make_app(jobs.env["REDIS_URL"], exchange).control.ping(timeout=1)) == {
        "w1",
        "plain",
    }
    assert pinged(app.control.ping(timeout=1)) == {"w1", "plain"}
