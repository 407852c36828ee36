"""AGENTJOBS_STATE_URL and the redis+sentinel:// broker spelling (store/client.py), and the rule
that tells a lost store from an unknown turn, without servers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from celery import Celery
from celery.backends.redis import SentinelBackend
from kombu import Connection

from tasks.core.settings import SettingsError, load_settings
from tasks.core.state_url import StateTarget, celery_sentinel, parse_state_url
from tasks.store import client
from tasks.store.client import lost_state
from tasks.testing import free_port
from tests.conftest import ROOT


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


# --- ACL users and TLS ---------------------------------------------------------------------


def test_cluster_and_sentinel_urls_keep_the_acl_username() -> None:
    cluster = parse_state_url("redis+cluster://app%40acme:p%3Aw@10.0.0.1:7000,10.0.0.2:7001")
    assert (cluster.username, cluster.password) == ("app@acme", "p:w")
    sentinel = parse_state_url("redis+sentinel://jobs:pw@a:26379,b:26380/mymaster/2")
    assert (sentinel.username, sentinel.password, sentinel.db) == ("jobs", "pw", 2)
    # the default user, spelled either way, is no username
    assert parse_state_url("redis+cluster://:pw@h:7000").username is None
    alone = parse_state_url("redis+sentinel://app@h:26379/m")
    assert (alone.username, alone.password) == ("app", None)
    assert "jobs" not in sentinel.describe() and "pw" not in sentinel.describe()


class _Recorder:
    """Stands in for a redis client class: records what it was built with."""

    built: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.built.append({"args": args, **kwargs})

    def master_for(self, name: str, **kwargs: Any) -> dict[str, Any]:
        self.built.append({"master": name, **kwargs})
        return {"master": name}


def test_the_state_client_logs_in_as_the_urls_user(monkeypatch: pytest.MonkeyPatch) -> None:
    _Recorder.built = []
    monkeypatch.setattr(client, "RedisCluster", _Recorder)
    monkeypatch.setattr(client, "Sentinel", _Recorder)
    client.connect(parse_state_url("redis+cluster://app:secret@h:7000"))
    client.connect(parse_state_url("redis+sentinel://app:secret@s:26379/mymaster/1"))
    cluster, sentinels, master = _Recorder.built
    assert (cluster["username"], cluster["password"]) == ("app", "secret")
    # the sentinels are asked without credentials, the master with the URL's
    assert sentinels["args"] == ([("s", 26379)],) and "username" not in sentinels
    assert (master["master"], master["username"], master["password"], master["db"]) == (
        "mymaster",
        "app",
        "secret",
        1,
    )


def test_a_sentinel_broker_url_keeps_the_username_in_celerys_spelling() -> None:
    url, options = celery_sentinel("redis+sentinel://app%40acme:p%2Fw@a:26379,b:26380/m/1", "X")
    assert url == "sentinel://app%40acme:p%2Fw@a:26379/1;sentinel://app%40acme:p%2Fw@b:26380/1"
    assert options == {"master_name": "m", "sentinel_kwargs": {}}
    # kombu's broker and Celery's result backend read the user and password back from it
    broker = Connection(url, transport_options=options)
    assert (broker.userid, broker.password) == ("app@acme", "p/w")
    backend = SentinelBackend(app=Celery(set_as_current=False), url=url)
    assert (backend.connparams["username"], backend.connparams["password"]) == ("app@acme", "p/w")


@pytest.mark.parametrize(
    ("variable", "fields"),
    [
        ("REDIS_URL", ("broker_url", "result_backend")),
        ("CELERY_BROKER_URL", ("broker_url",)),
        ("CELERY_RESULT_BACKEND", ("result_backend",)),
    ],
)
def test_a_rediss_broker_or_backend_verifies_certificates_unless_told_otherwise(
    variable: str, fields: tuple[str, ...]
) -> None:
    settings = load_settings({variable: "rediss://:pw@h:6380/0"})
    for name in fields:
        assert getattr(settings, name) == "rediss://:pw@h:6380/0?ssl_cert_reqs=required"
    # the state store keeps its URL: redis-py verifies certificates by default
    assert load_settings({"REDIS_URL": "rediss://h:6380/0"}).state_url == "rediss://h:6380/0"


def test_an_explicit_ssl_cert_reqs_is_kept_and_a_bad_one_refused_by_name() -> None:
    kept = "rediss://h:6380/0?ssl_ca_certs=%2Fetc%2Fca.pem&ssl_cert_reqs=optional"
    settings = load_settings({"CELERY_BROKER_URL": kept, "CELERY_RESULT_BACKEND": kept})
    assert settings.broker_url == settings.result_backend == kept
    added = load_settings({"CELERY_BROKER_URL": "rediss://h:6380/0?ssl_ca_certs=%2Fca.pem"})
    assert added.broker_url == "rediss://h:6380/0?ssl_ca_certs=%2Fca.pem&ssl_cert_reqs=required"
    for variable in ("REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        with pytest.raises(SettingsError) as refused:
            load_settings({variable: "rediss://:hunter2@h:6380/0?ssl_cert_reqs=maybe"})
        assert str(refused.value).startswith(f"{variable}: ssl_cert_reqs must be")
        assert "hunter2" not in str(refused.value)


def test_a_celery_app_from_rediss_urls_sets_up_its_connections(tmp_path: Path) -> None:
    # A fresh process, as a worker: Celery's result backend used to refuse a rediss:// URL
    # without ssl_cert_reqs as it was built (the worker exited), and kombu verified nothing.
    probe = (
        "import ssl, redis, kombu.exceptions; from tasks import app; "
        "backend = app.backend; "
        "print(backend.connparams['ssl_cert_reqs'] == ssl.CERT_REQUIRED); "
        "print(app.connection_for_write().ssl == {'ssl_cert_reqs': ssl.CERT_REQUIRED}); "
        "print(app.connection_for_read().ssl == {'ssl_cert_reqs': ssl.CERT_REQUIRED}); "
        "\ntry:\n    backend.client.ping()\nexcept redis.ConnectionError:\n    print('refused')"
    )
    nowhere = f"rediss://127.0.0.1:{free_port()}"
    for env in (
        {"REDIS_URL": f"{nowhere}/0"},
        {"CELERY_BROKER_URL": f"{nowhere}/1", "CELERY_RESULT_BACKEND": f"{nowhere}/2"},
    ):
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["True", "True", "True", "refused"], done.stdout
