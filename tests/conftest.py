"""Shared test helpers: the reference runtime's compatibility files, vendored under
tests/fixtures/ (written by agentfootprint 9.62; see
tests/fixtures/agentfootprint-9.62/README.md)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]


COMPAT_DIR = ROOT / "tests" / "fixtures" / "agentfootprint-9.62"


def load_compat(name: str) -> object:
    return orjson.loads((COMPAT_DIR / name).read_bytes())


@pytest.fixture(scope="session")
def compat_dir() -> Path:
    # Missing fixtures are a broken checkout, not a reason to skip the compatibility target.
    assert COMPAT_DIR.is_dir(), f"compat fixtures not found at {COMPAT_DIR}"
    return COMPAT_DIR
