"""README.md's runtime-alone snippet runs as pasted, its error path included (the job system's
"Use it" section is run as written by tests/tasks/test_readme_use_it.py)."""

from __future__ import annotations

import contextlib
import io
import re

from tests.conftest import ROOT

MARKER = "Without the job system, the runtime alone"


def code_block_after(marker: str, language: str = "python") -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert marker in text, f"README.md lost its {marker!r} paragraph"
    found = re.search(rf"```{language}\n(.*?)```", text.split(marker, 1)[1], re.S)
    assert found, f"no {language} block after {marker!r}"
    return found.group(1)


def test_the_runtime_alone_snippet_runs_as_pasted() -> None:
    code = code_block_after(MARKER)
    printed = io.StringIO()
    namespace: dict[str, object] = {"__name__": "readme"}
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), namespace)
    assert printed.getvalue().splitlines() == ["Order A-17 has shipped.", "You're welcome!"]
    # The error path ran: the checkpoint was saved and resumed, and every model step was used.
    assert isinstance(namespace.get("saved"), str | bytes)
    assert getattr(namespace["model"], "remaining", None) == 0
