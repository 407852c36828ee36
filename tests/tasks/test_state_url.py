"""AGENTJOBS_STATE_URL and the redis+sentinel:// broker spelling (tasks/state.py), and the rule
that tells a lost store from an unknown turn, without servers."""

from __future__ import annotations

import time

import pytest

from tasks.settings import SettingsError, load_settings
from tasks.state import StateTarget, celery_sentinel, lost_state, parse_state_url


def test_every_url_form_parses() -> None:
    assert parse_state_url("redis://127.0.0.1:6379/2").kind == "redis"
    assert parse_state_url("rediss://h:6380/0").kind == "redis"
    cluster = parse_state_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001")
    assert cluster == StateTarget(
        "cluster",
        "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001",
        (("10.0.0.1", 7000), ("10.0.0.2", 7001)),
        password="pw",
    )
    sentinel = parse_state_url("redis+sentinel://:s%40cret@a:26379,b:26380/mymaster/3")
    assert (sentinel.kind, sentinel.nodes, sentinel.master_name, sentinel.db) == (
        "sentinel",
        (("a", 26379), ("b", 26380)),
        "mymaster",
        3,
    )
    assert sentinel.password == "s@cret"
    assert parse_state_url("redis+sentinel://a:26379/m").db == 0
    assert "pw" not in cluster.describe() and cluster.describe().endswith("10.0.0.2:7001")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://x:1", "must be a redis://"),
        ("redis+cluster://", "at least one host:port"),
        ("redis+cluster://h:notaport", "host:port items"),
        ("redis+cluster://h:7000/1", "database 0 only"),
        ("redis+sentinel://h:26379", "must name the Sentinel master"),
        ("redis+sentinel://h:26379/m/x", "must be a number"),
    ],
)
def test_bad_state_urls_are_refused_by_name_without_the_value(url: str, problem: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"AGENTJOBS_STATE_URL": url.replace("h:", "secret-host:")})
    assert "AGENTJOBS_STATE_URL" in str(refused.value) and problem in str(refused.value)
    assert "secret-host" not in str(refused.value)


def test_state_url_defaults_to_redis_url() -> None:
    settings = load_settings({"REDIS_URL": "redis://10.1.1.1:6390/0"})
    assert settings.state_url == settings.broker_url == "redis://10.1.1.1:6390/0"


def test_a_cluster_is_refused_as_broker_or_backend() -> None:
    for variable in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        with pytest.raises(SettingsError, match=f"{variable} cannot be a Redis Cluster"):
            load_settings({variable: "redis+cluster://h:7000"})


def test_a_sentinel_broker_url_becomes_celerys_spelling() -> None:
    url, options = celery_sentinel("redis+sentinel://:pw@a:26379,b:26380/mymaster/1", "X")
    assert url == "sentinel://:pw@a:26379/1;sentinel://:pw@b:26380/1"
    assert options == {"master_name": "mymaster", "sentinel_kwargs": {}}
    assert celery_sentinel("amqp://guest:guest@h:5672/v", "X") == (
        "amqp://guest:guest@h:5672/v",
        {},
    )


def test_lost_state_tells_a_lost_store_from_an_unknown_turn() -> None:
    now_ms = int(time.time() * 1000)
    # No stamp: a message sent around run_turn.delay, the old rule applies
    assert lost_state(None, "e1", record_ttl_s=600) == ""
    # Another epoch: the store it was sent to is gone
    assert "epoch" in lost_state({"epoch": "e0", "sentAtMs": now_ms}, "e1", record_ttl_s=600)
    # This epoch, but younger than a finished record lives: its writes were lost
    assert "writes were lost" in lost_state(
        {"epoch": "e1", "sentAtMs": now_ms - 5_000}, "e1", record_ttl_s=600
    )
    # This epoch and older than a record lives: an expired turn, not a loss
    old = {"epoch": "e1", "sentAtMs": now_ms - 700_000}
    assert lost_state(old, "e1", record_ttl_s=600) == ""
