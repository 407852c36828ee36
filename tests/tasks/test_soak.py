"""The chaos soak (bench/soak.py) as a test: opt-in (`./dev test -m slow`), a small run in a
subprocess (its own private Redis, workers and pump), judged by its exit status and the checks it
prints. The soak's checks are themselves tested on hand-made evidence in bench/."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SOAK_TIMEOUT_S = 600
# Every check bench/soak.py prints (the first words of each).
CHECKS = (
    "the run finished",
    "every turn ended exactly once",
    "Celery results match the turn records",
    "stored conversations are exactly their succeeded turns",
    "side effects repeated only in iterations in flight",
    "dead letters are exactly the 401",
    "no API key or endpoint host",
    "the chaos landed",
    "no worker or pump exited on its own",
    "every shared process alive at the end",
)


# And the checks only the mixed soak prints.
MIXED_CHECKS = (
    *CHECKS,
    "no budget window over its limit",
    "no tenant ran more turns at once than its cap",
    "every stream reader saw every event once",
    "bad requests refused by name",
)


def passing_soak(*options: str, checks: tuple[str, ...]) -> str:
    """Run bench/soak.py with `options` in a subprocess; its output, once it exited 0 and printed
    each of `checks` (the first words of each) as passed, and no other check."""
    command = [sys.executable, "bench/soak.py", *options]
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=SOAK_TIMEOUT_S
    )
    print(completed.stdout)
    output = completed.stdout
    assert completed.returncode == 0, output[-6000:] + completed.stderr[-3000:]
    assert output.rstrip().endswith("soak PASSED")
    verdicts = [
        line.strip() for line in output.splitlines() if line.startswith(("  PASS", "  FAIL"))
    ]
    assert len(verdicts) == len(checks), verdicts
    for check in checks:
        assert any(v.startswith(f"PASS  {check}") for v in verdicts), (check, verdicts)
    return output


@pytest.mark.slow
@pytest.mark.integration
def test_a_small_chaos_soak_passes() -> None:
    # Given a soak of 100 turns over 20 conversations (still 3 worker kills and a Redis restart)
    # When it runs, then it exits 0, every check it printed passed, and the chaos happened
    output = passing_soak("--turns", "100", "--conversations", "20", checks=CHECKS)
    assert "kill w1 at" in output and "restart redis at" in output


@pytest.mark.slow
@pytest.mark.integration
def test_a_small_mixed_soak_passes() -> None:
    # Given a mixed soak of 400 turns over 40 conversations of three tenants: kills, a Redis
    # restart, a deploy, cancels, approvals decided by another process, hung tools past their
    # deadlines, a shared budget and caps, stream readers, bad requests and messages
    # When it runs, then every check it printed passed
    options = ("--mixed", "--turns", "400", "--conversations", "40")
    output = passing_soak(*options, checks=MIXED_CHECKS)
    assert "deploy at" in output and "restart redis at" in output
