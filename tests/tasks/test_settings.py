"""Settings: one reader of the environment (tasks/core/settings.py), every value checked and refused
by its variable's name, Celery configured from it, and no other reader anywhere."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.core.settings import Settings, SettingsError, load_settings, parse_agents
from tests.conftest import ROOT

KEY = "sk-test-Settings0123456789SECRET"


def test_redis_url_alone_configures_everything() -> None:
    settings = load_settings({"REDIS_URL": "redis://h:1/2"})
    assert settings.redis_url == settings.broker_url == settings.result_backend == "redis://h:1/2"
    assert settings.max_attempts == 5 and settings.backoff_base_s == 2.0
    assert settings.agents == {}, "no agent is registered by default (the demo registers its own)"


def test_recovery_defaults_stay_within_ten_seconds() -> None:
    settings = load_settings({})
    assert settings.lease_ttl_s == 9 and settings.stall_after_s == 10
    assert settings.index_shards == 16


def test_queue_names_derive_from_the_key_prefix_unless_set() -> None:
    default = load_settings({})
    assert (default.turn_queue, default.retry_queue) == ("agentjobs.turns", "agentjobs.retry")
    blue = load_settings({"AGENTJOBS_KEY_PREFIX": "blue"})
    assert (blue.turn_queue, blue.retry_queue) == ("blue.turns", "blue.retry")
    named = load_settings({"AGENTJOBS_KEY_PREFIX": "blue", "AGENTJOBS_TURN_QUEUE": "q1"})
    assert (named.turn_queue, named.retry_queue) == ("q1", "blue.retry")


def test_the_registry_is_merged_with_agentjobs_agents_which_wins() -> None:
    registry = {"support": "myapp.agents:build_support", "billing": "myapp.agents:build_billing"}
    environ = {"AGENTJOBS_AGENTS": "billing=other.module:build, extra = m:f"}
    settings = load_settings(environ, registry=registry)
    assert dict(settings.agents) == {
        "support": "myapp.agents:build_support",
        "billing": "other.module:build",
        "extra": "m:f",
    }
    assert registry == {
        "support": "myapp.agents:build_support",
        "billing": "myapp.agents:build_billing",
    }, "the registry given is not changed"


def test_content_capture_is_off_unless_turned_on() -> None:
    assert load_settings({}).otel_capture_content is False
    assert load_settings({"AGENTJOBS_OTEL_CAPTURE_CONTENT": "1"}).otel_capture_content is True
    assert load_settings({"AGENTJOBS_OTEL_CAPTURE_CONTENT": "false"}).otel_capture_content is False


def test_a_blank_value_counts_as_unset() -> None:
    settings = load_settings({"AGENTJOBS_MAX_ATTEMPTS": "", "AGENTJOBS_LEASE_TTL_S": "  "})
    assert settings.max_attempts == 5 and settings.lease_ttl_s == 9


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "AGENTJOBS_LEASE_TTL_S",
            "x",
            "AGENTJOBS_LEASE_TTL_S must be a number of seconds > 0, got 'x'",
        ),
        ("AGENTJOBS_LEASE_TTL_S", "0", "AGENTJOBS_LEASE_TTL_S must be a number of seconds > 0"),
        ("AGENTJOBS_BACKOFF_BASE_S", "nan", "AGENTJOBS_BACKOFF_BASE_S must be a number of seconds"),
        ("AGENTJOBS_BACKOFF_MAX_S", "inf", "AGENTJOBS_BACKOFF_MAX_S must be a number of seconds"),
        ("AGENTJOBS_PUMP_INTERVAL_S", "-1", "AGENTJOBS_PUMP_INTERVAL_S must be"),
        ("AGENTJOBS_STALL_AFTER_S", "soon", "AGENTJOBS_STALL_AFTER_S must be"),
        ("AGENTJOBS_RESULT_GRACE_S", "0", "AGENTJOBS_RESULT_GRACE_S must be"),
        ("AGENTJOBS_SHUTDOWN_GRACE_S", "-5", "AGENTJOBS_SHUTDOWN_GRACE_S must be"),
        ("AGENTJOBS_PROVIDER_TIMEOUT_S", "0", "AGENTJOBS_PROVIDER_TIMEOUT_S must be"),
        (
            "AGENTJOBS_RECORD_TTL_S",
            "1.5",
            "AGENTJOBS_RECORD_TTL_S must be a whole number of seconds",
        ),
        (
            "AGENTJOBS_MAX_ATTEMPTS",
            "many",
            "AGENTJOBS_MAX_ATTEMPTS must be a whole number >= 1, got 'many'",
        ),
        ("AGENTJOBS_MAX_DELIVERIES", "0", "AGENTJOBS_MAX_DELIVERIES must be a whole number >= 1"),
        (
            "AGENTJOBS_INDEX_SHARDS",
            "20000",
            "AGENTJOBS_INDEX_SHARDS must be a whole number >= 1 and <= 16384",
        ),
        ("AGENTJOBS_WORKER_CONCURRENCY", "-3", "AGENTJOBS_WORKER_CONCURRENCY must be"),
        ("AGENTJOBS_KEY_PREFIX", "a b", "AGENTJOBS_KEY_PREFIX must be a key prefix"),
        ("AGENTJOBS_KEY_PREFIX", "{tag}", "AGENTJOBS_KEY_PREFIX must be a key prefix"),
        ("AGENTJOBS_TURN_QUEUE", "a,b", "AGENTJOBS_TURN_QUEUE must be a queue name"),
        (
            "AGENTJOBS_RETRY_QUEUE",
            "agentjobs.turns",
            "AGENTJOBS_TURN_QUEUE and AGENTJOBS_RETRY_QUEUE must differ",
        ),
        ("AGENTJOBS_AGENTS", "justaname", "AGENTJOBS_AGENTS must list name=module:factory items"),
        ("AGENTJOBS_AGENTS", "a=module", "AGENTJOBS_AGENTS must list name=module:factory items"),
        (
            "AGENTJOBS_PROVIDER",
            "gemini",
            "AGENTJOBS_PROVIDER must be one of scripted, openai, anthropic",
        ),
        ("AGENTJOBS_PROVIDER", "openai", "AGENTJOBS_MODEL must name the model"),
        ("REDIS_URL", "localhost:6379", "REDIS_URL must be a redis:// or rediss:// or unix:// URL"),
        ("CELERY_BROKER_URL", "nowhere", "CELERY_BROKER_URL must be a scheme:// URL"),
        ("CELERY_RESULT_BACKEND", "nowhere", "CELERY_RESULT_BACKEND must be a scheme:// URL"),
        ("OPENAI_BASE_URL", "api.example", "OPENAI_BASE_URL must be an http:// or https:// URL"),
        ("ANTHROPIC_BASE_URL", "ftp://x", "ANTHROPIC_BASE_URL must be an http:// or https:// URL"),
        (
            "OPENAI_API_KEY",
            "sk-a b",
            "OPENAI_API_KEY contains characters that cannot go in an HTTP",
        ),
        ("ANTHROPIC_API_KEY", "k\x00", "ANTHROPIC_API_KEY contains characters"),
        (
            "AGENTJOBS_OTEL_CAPTURE_CONTENT",
            "maybe",
            "AGENTJOBS_OTEL_CAPTURE_CONTENT must be 1 or 0",
        ),
    ],
)
def test_a_bad_value_is_refused_by_its_variable_name(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({variable: value})
    assert str(refused.value).startswith(message)


def test_backoff_cap_below_its_base_is_refused() -> None:
    with pytest.raises(SettingsError, match="AGENTJOBS_BACKOFF_MAX_S must be at least"):
        load_settings({"AGENTJOBS_BACKOFF_BASE_S": "10", "AGENTJOBS_BACKOFF_MAX_S": "5"})
    with pytest.raises(SettingsError, match="AGENTJOBS_AGENTS"):
        parse_agents("justaname")


def test_api_keys_and_urls_appear_in_no_repr_and_no_error() -> None:
    settings = load_settings(
        {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY + "2", "OPENAI_BASE_URL": "http://h/v1"}
    )
    assert settings.openai_api_key == KEY and settings.anthropic_api_key == KEY + "2"
    assert KEY not in repr(settings) and KEY not in str(settings)
    secret_url = "redis://:hunter2hunter2@db.internal:6379/0"
    for environ in (
        {"OPENAI_API_KEY": KEY + " x"},
        {"ANTHROPIC_API_KEY": KEY + "\u00e9"},
        {"REDIS_URL": secret_url.replace("redis://", "http://")},
        {"OPENAI_BASE_URL": f"ftp://{KEY}@gw"},
    ):
        with pytest.raises(SettingsError) as refused:
            load_settings(environ)
        assert KEY not in str(refused.value) and "hunter2" not in str(refused.value)


def test_celery_takes_its_values_from_settings(tmp_path: Path) -> None:
    # A fresh process: celeryconfig reads Settings once, when the app loads it.
    probe = (
        "from tasks import app; c = app.conf; "
        "print(c.broker_url, c.result_backend, c.result_expires, c.task_default_queue, "
        "sorted(q.name for q in c.task_queues), c.task_routes['tasks.resume_turn']['queue'], "
        "c.control_exchange, c.event_exchange, c.worker_concurrency, "
        "c.result_backend_transport_options['global_keyprefix'], "
        "app.backend.get_key_for_task('t1').decode(), app.control.mailbox.serializer, "
        "c.worker_send_task_events, c.task_send_sent_event, c.result_extended)"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "REDIS_URL": "redis://127.0.0.1:1/3",
        "CELERY_RESULT_BACKEND": "redis://127.0.0.1:2/4",
        "AGENTJOBS_KEY_PREFIX": "blue",
        "AGENTJOBS_RECORD_TTL_S": "3600",
        "AGENTJOBS_WORKER_CONCURRENCY": "5",
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "redis://127.0.0.1:1/3",
        "redis://127.0.0.1:2/4",
        "3600",
        "blue.turns",
        "['blue.retry',",
        "'blue.turns']",
        "blue.retry",
        "blue",
        "blue.events",
        "5",
        "blue:",
        "blue:celery-task-meta-t1",
        "json",
        "False",
        "False",
        "False",
    ]


# --- one reader ------------------------------------------------------------------------------

_ENV_READ = re.compile(r"os\.environ|getenv|environ\.get")


def test_only_settings_reads_the_environment_in_tasks_and_celeryconfig() -> None:
    # tasks/testing.py and the demo build their child processes' environments from this one.
    allowed = {"tasks/core/settings.py", "tasks/testing.py", "tasks/demo/__init__.py"}
    readers = {
        str(path.relative_to(ROOT))
        for path in [*sorted((ROOT / "tasks").rglob("*.py")), ROOT / "celeryconfig.py"]
        if _ENV_READ.search(path.read_text())
    }
    assert readers <= allowed, readers - allowed


def test_the_runtime_reads_no_agentjobs_variable() -> None:
    readers = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "agent").rglob("*.py"))
        if "AGENTJOBS_" in path.read_text()
    ]
    assert readers == []


def code_outside_settings() -> str:
    paths = [*sorted((ROOT / "tasks").rglob("*.py")), ROOT / "celeryconfig.py"]
    return "\n".join(p.read_text() for p in paths if p.name != "settings.py")


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Settings)])
def test_every_setting_is_used(name: str) -> None:
    assert re.search(rf"\.{name}\b", code_outside_settings()), f"Settings.{name} is never read"


def test_every_variable_is_in_the_readmes_settings_tables() -> None:
    source = (ROOT / "tasks/core/settings.py").read_text()
    variables = set(re.findall(r'env\.\w+\(\s*"([A-Z][A-Z0-9_]+)"', source))
    assert {"REDIS_URL", "AGENTJOBS_OTEL_CAPTURE_CONTENT"} <= variables
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tables = readme.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in tables.splitlines() if line.startswith("| `")]
    missing = {v for v in variables if not any(f"`{v}`" in row for row in rows)}
    assert not missing, f"README's settings tables lack {sorted(missing)}"
