"""./dev, the everyday entry point: its usage, and a .venv of an unsupported Python made again.
Run on a copy of the script with stand-in interpreters, so no real .venv is touched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import ROOT

# A stand-in for python3: `-m venv .venv` makes a .venv whose python logs its arguments and
# succeeds at everything, the version check included (a new enough Python).
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Python 3.11.9"; exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/sh\\necho "$@" >> "%s/venv.log"\\n' "$PWD" > "$3/bin/python"
  chmod +x "$3/bin/python"
fi
"""


def copy_of_dev(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "dev", tmp_path / "dev")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "python3").chmod(0o755)
    return tmp_path


def dev(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "dev"), *args],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(root / "python3")},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_dev_and_dev_help_print_the_usage_without_making_a_venv(tmp_path: Path) -> None:
    root = copy_of_dev(tmp_path)
    for args in ((), ("help",), ("--help",)):
        done = dev(root, *args)
        assert done.returncode == 0, done.stderr
        assert "./dev test [ARGS]" in done.stdout and "./dev check" in done.stdout
        assert not done.stdout.startswith("#")
    assert not (root / ".venv").exists()
    unknown = dev(root, "tset")
    assert unknown.returncode == 2 and "no command 'tset'" in unknown.stderr
    assert "./dev demo" in unknown.stderr


def test_a_venv_of_an_old_python_is_rebuilt_and_a_good_one_reused(tmp_path: Path) -> None:
    root = copy_of_dev(tmp_path)
    # Given a .venv whose python is 3.10 (it fails the version check)
    (root / ".venv" / "bin").mkdir(parents=True)
    old = root / ".venv" / "bin" / "python"
    old.write_text("#!/bin/sh\necho 'Python 3.10.12'\nexit 1\n")
    old.chmod(0o755)
    (root / ".venv" / ".installed").touch()
    # When ./dev runs a command
    done = dev(root, "test", "-q")
    # Then it says why and makes .venv again with the interpreter it was given
    assert done.returncode == 0, done.stderr
    assert "rebuilding .venv: it was made by Python 3.10.12" in done.stderr
    log = (root / "venv.log").read_text()
    assert "-m pip install --quiet -e .[test]" in log and log.endswith("-m pytest -q\n")
    # and the next run reuses the new one
    (root / "venv.log").unlink()
    again = dev(root, "test")
    assert "rebuilding" not in again.stderr and "setting up" not in again.stderr
    assert (root / "venv.log").read_text().endswith("-m pytest\n")
