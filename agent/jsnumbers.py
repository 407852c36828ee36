"""JSON numbers as the reference runtime writes them (JavaScript's JSON.stringify).

JavaScript has one number type, a double, so the reference writes `2.0` as `2`, `-0` as `0`,
`1e21` as `1e+21`, `1e-6` as `0.000001` and 2**60 as `1152921504606847000`
(Number.prototype.toString). Python keeps int and float apart and orjson writes `2.0`.

The runtime normalises a value once, where it enters (a provider's tool-call args, a tool's
return value, a loaded checkpoint, a tool's input schema), into a value orjson already writes
with the reference's text, so every later write is a plain orjson call:

- a number that is a safe integer (|x| <= 2**53) becomes that `int`;
- any other number keeps the double JavaScript would hold: a `float` when orjson writes it as
  JavaScript does, an `int` of the reference's digits when it is whole and fits orjson's 64 bits,
  else an `orjson.Fragment` holding the reference's text (rare; with orjson 3.13 only
  1e-6 <= |x| < 1e-5 and whole numbers from 2**64 to 1e21). Code that hands values to users
  (tool args) reads Fragments back as plain numbers with `plain_json`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

# Every integer up to 2**53 in size is exact as a double: JavaScript writes it digit for digit.
EXACT_INT = 2**53
# orjson writes ints in this range and raises beyond it.
_ORJSON_MIN_INT = -(2**63)
_ORJSON_MAX_INT = 2**64 - 1
# Number::toString switches to exponent notation at and above this.
_JS_EXPONENT_FROM = 1e21


def js_number_text(value: float) -> str:
    """ECMAScript Number::toString(10) of a finite double, from Python's shortest digits
    (repr, like JavaScript, gives the shortest digit string that reads back as the same double)."""
    if value == 0:
        return "0"
    if value < 0:
        return "-" + js_number_text(-value)
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    digits = all_digits.lstrip("0")
    # n: where the decimal point sits relative to the first significant digit (ECMA's n).
    n = len(whole) + int(exponent or 0) - (len(all_digits) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    sign = "+" if n >= 1 else "-"
    head = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{head}e{sign}{abs(n - 1)}"


def js_number(value: int | float) -> Any:
    """`value` as a number orjson writes exactly as JSON.stringify does (see the module doc)."""
    if isinstance(value, int):  # a bool is returned as it is: it is in range
        if -EXACT_INT <= value <= EXACT_INT:
            return value
        try:
            return _double(float(value))
        except OverflowError:  # beyond any double: JavaScript holds Infinity, written null
            return None
    if not math.isfinite(value):
        return value  # orjson writes null, as JSON.stringify does
    if value == 0:
        return 0  # -0 too: JSON.stringify(-0) is "0"
    if value.is_integer() and -EXACT_INT <= value <= EXACT_INT:
        return int(value)
    return _double(value)


def _double(value: float) -> Any:
    text = js_number_text(value)
    if orjson.dumps(value) == text.encode():
        return value
    if value.is_integer() and abs(value) < _JS_EXPONENT_FROM:
        digits = int(text)  # the reference's digits: the same double, written as an integer
        if _ORJSON_MIN_INT <= digits <= _ORJSON_MAX_INT:
            return digits
    return orjson.Fragment(text)


def js_json(value: Any) -> Any:
    """`value` with every number as the reference writes it. Containers are copied only where
    something changed; tuples become lists (JSON arrays)."""
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return js_number(value if type(value) is int else int(value))
    if isinstance(value, float):
        return js_number(value if type(value) is float else float(value))
    if isinstance(value, dict):
        items = {key: js_json(item) for key, item in value.items()}
        unchanged = type(value) is dict and all(items[key] is item for key, item in value.items())
        return value if unchanged else items
    if isinstance(value, list | tuple):
        listed = [js_json(item) for item in value]
        unchanged = type(value) is list and all(a is b for a, b in zip(listed, value, strict=True))
        return value if unchanged else listed
    return value


def needs_js_numbers(value: Any) -> bool:
    """Whether `js_json` would change a number in parsed JSON `value` (mappings and sequences of
    other types are looked into too, for checkpoints given as Python data)."""
    kind = type(value)
    if kind is str:
        return False
    # Plain loops, not any(...): this runs on every checkpoint load and a generator costs more.
    if kind is dict:
        for item in value.values():  # noqa: SIM110
            if type(item) is not str and needs_js_numbers(item):
                return True
        return False
    if kind is list:
        for item in value:  # noqa: SIM110
            if type(item) is not str and needs_js_numbers(item):
                return True
        return False
    if kind is int:
        return not -EXACT_INT <= value <= EXACT_INT
    if kind is float:
        return js_number(value) is not value
    if isinstance(value, Mapping):
        return any(needs_js_numbers(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(needs_js_numbers(item) for item in value)
    return False


def normalize_in_place(value: dict[str, Any] | list[Any]) -> None:
    """`js_json` for freshly parsed JSON that nobody else holds: numbers are replaced in place and
    nothing is copied. Strings, the bulk of a checkpoint, cost one type test each."""
    pairs = value.items() if type(value) is dict else enumerate(value)
    for key, item in pairs:
        kind = type(item)
        if kind is str:
            continue
        if kind is dict or kind is list:
            normalize_in_place(item)
        elif kind is int:
            if not -EXACT_INT <= item <= EXACT_INT:
                value[key] = js_number(item)  # type: ignore[index]
        elif kind is float:
            number = js_number(item)
            if number is not item:
                value[key] = number  # type: ignore[index]


def plain_json(value: Any) -> Any:
    """`value` with any Fragment read back as the Python number it writes (for tool code, which
    expects numbers); the value itself when it holds none."""
    if isinstance(value, orjson.Fragment):
        return orjson.loads(orjson.dumps(value))  # a Fragment keeps its text to itself
    if isinstance(value, dict):
        items = {key: plain_json(item) for key, item in value.items()}
        return value if all(items[key] is item for key, item in value.items()) else items
    if isinstance(value, list):
        listed = [plain_json(item) for item in value]
        return value if all(a is b for a, b in zip(listed, value, strict=True)) else listed
    return value
