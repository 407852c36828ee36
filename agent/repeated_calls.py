"""The identical-call note: a turn's second identical landing of a tool call says so (p02).

The reference appends a note, never a refusal, the second time within one run that a tool gives
exactly the same result for exactly the same args (key order ignored, array order kept). The
third and later landings add nothing, and the count restarts with every run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

# The landing that earns the note: the first repeat is the first moment the fact exists.
NOTE_AT_LANDING = 2

IDENTICAL_CALL_NOTE = (
    "\n\n[identical call: '{tool}' has now returned exactly this result {count} times this "
    "turn, for exactly these arguments. Calling it again will not change it — act on what you "
    "have, or change the arguments (a different filter, a wider range, a different tool). If "
    "you are waiting for something to change, say so in your answer rather than calling again.]"
)


def identical_call_note(tool: str, count: int = NOTE_AT_LANDING) -> str:
    return IDENTICAL_CALL_NOTE.format(tool=tool, count=count)


def _args_key(args: Mapping[str, Any]) -> bytes | None:
    """Args as canonical JSON (keys sorted at every depth), or None when they cannot be written,
    which makes the call count as never repeated."""
    try:
        return orjson.dumps(args, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return None


@dataclass
class RepeatedCalls:
    """One run's landings: (tool, args, result) -> how many times it came back."""

    _landings: dict[tuple[str, bytes, str], int] = field(default_factory=dict)

    def note_for(self, tool: str, args: Mapping[str, Any], result: str) -> str:
        """Count this landing; the note to append to its result, or ''."""
        args_key = _args_key(args)
        if args_key is None:
            return ""
        key = (tool, args_key, result)
        count = self._landings.get(key, 0) + 1
        self._landings[key] = count
        return identical_call_note(tool, count) if count == NOTE_AT_LANDING else ""
