"""A skewed wall clock for one process, through libfaketime (the `faketime` Debian package;
.ci/run installs it)."""

from __future__ import annotations

import glob
import os

from tests.conftest import ROOT

IN_CI = os.environ.get("CI") == "true"


def faketime_prefix(offset_s: float) -> list[str] | None:
    """A command prefix that runs a Python process with its wall clock `offset_s` seconds off,
    or None without libfaketime.

    `env LD_PRELOAD=...` rather than the `faketime` command, which forks and does not pass
    signals on: the process the test kills must be the skewed one. The monotonic clock stays
    true (skew is about wall time, and Python's timed waits hang under a faked one); the
    sitecustomize in faketime_shim/ puts back the time.sleep that libfaketime 0.9.10 breaks then.
    """
    libraries = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libraries:
        return None
    shim = ROOT / "tests" / "tasks" / "faketime_shim"
    return [
        "env",
        f"LD_PRELOAD={libraries[0]}",
        f"FAKETIME={offset_s:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
        f"PYTHONPATH={shim}{os.pathsep}{ROOT}",
    ]
