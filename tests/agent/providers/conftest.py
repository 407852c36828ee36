from __future__ import annotations

from collections.abc import Iterator

import pytest
from provider_servers import ScriptedServer


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    srv.start()
    yield srv
    srv.stop()
