"""Shared test helpers: where the reference runtime's compatibility files live."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    configured = os.environ.get("AGENTJOBS_SHARED_DIR")
    return Path(configured) if configured else ROOT.parent / "shared"


COMPAT_DIR = shared_dir() / "compat" / "agentfootprint-9.62"


def load_compat(name: str) -> object:
    return orjson.loads((COMPAT_DIR / name).read_bytes())


@pytest.fixture(scope="session")
def compat_dir() -> Path:
    # Missing fixtures are a broken checkout, not a reason to skip the compatibility target.
    assert COMPAT_DIR.is_dir(), f"compat fixtures not found at {COMPAT_DIR}"
    return COMPAT_DIR
