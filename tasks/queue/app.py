"""The Celery app, with orjson registered as a serializer under its own content type and its
remote control in JSON."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
from celery import Celery
from celery.app.control import Control
from celery.signals import after_setup_logger, after_setup_task_logger
from kombu.serialization import register

from tasks.core.redact import RedactingFilter
from tasks.queue import broker, workarounds

ORJSON_CONTENT_TYPE = "application/x-orjson"


def _default(value: Any) -> Any:
    # Values Celery itself may put in a message or a result; our own payloads are plain JSON.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, set | frozenset):
        return list(value)
    if isinstance(value, Decimal | UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def orjson_dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_default)


def orjson_loads(data: bytes | str) -> Any:
    return orjson.loads(data)


register(  # type: ignore[no-untyped-call]
    "orjson",
    orjson_dumps,
    orjson_loads,
    content_type=ORJSON_CONTENT_TYPE,
    content_encoding="binary",
)

workarounds.install()
broker.install()


class JSONControl(Control):  # type: ignore[misc]
    """Celery's remote control, its broadcasts and replies in JSON.

    Celery's mailbox serializes with task_serializer (orjson here), and a worker of any other
    Celery app on the same Redis refuses an orjson reply to its mingle hello and exits
    (ContentDisallowed). Control messages carry none of our payloads: JSON costs nothing.
    """

    def __init__(self, app: Celery | None = None) -> None:
        super().__init__(app)
        self.mailbox.serializer = "json"


class AgentjobsCelery(Celery):  # type: ignore[misc]
    """The app: its result backend is built only once its configuration is loaded, which may
    name the backend (_translated_urls). Celery picks the backend before it loads the
    configuration when the backend is the first thing a process uses (a client's
    AsyncResult.get()), and would take CELERY_RESULT_BACKEND as the environment spells it."""

    @property
    def backend(self) -> Any:
        if not self.configured:
            self.conf.get("result_backend")  # the first lookup of a key loads the configuration
        return super().backend


app = AgentjobsCelery("agentjobs", control=JSONControl)
app.config_from_object("celeryconfig")


@app.on_after_configure.connect  # type: ignore[untyped-decorator]
def _translated_urls(sender: Celery, source: Any, **_: Any) -> None:
    # Celery reads CELERY_BROKER_URL and CELERY_RESULT_BACKEND from the environment itself, and
    # they win over celeryconfig.py's values, which Settings translated from them (a
    # redis+sentinel:// URL in Celery's spelling, a rediss:// URL given ssl_cert_reqs): where
    # the two differ, the translated one wins, as the app's backend class and as the broker's
    # read and write URLs.
    translated = source.get("agentjobs_result_backend")
    if not translated and source.get("result_backend") != source.result_backend:
        translated = source.get("result_backend")
    if translated:
        sender.backend_cls = translated
    broker = source.get("broker_url")
    if broker and broker != source.broker_url and not source.get("broker_read_url"):
        source.update(broker_read_url=broker, broker_write_url=broker)


@after_setup_logger.connect  # type: ignore[untyped-decorator]
@after_setup_task_logger.connect  # type: ignore[untyped-decorator]
def _redact_logs(logger: Any, **_: Any) -> None:
    for handler in logger.handlers:
        handler.addFilter(RedactingFilter())
