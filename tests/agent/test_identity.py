"""The storage namespace of an identity (docs/checkpoint.md, "Memory namespace"):
injective, absent parts as `_`,
and a field that is not a string refused without quoting it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import encode_namespace


@pytest.mark.parametrize(
    ("identity", "key"),
    [
        (
            {"tenant": "acme", "principal": "user-42", "conversationId": "conv-001"},
            "acme/user-42/conv-001",
        ),
        ({"conversationId": "c"}, "_/_/c"),
        ({"tenant": None, "principal": "", "conversationId": "c"}, "_/_/c"),
        (None, "_/_/_"),
        ({"tenant": "_", "conversationId": "c"}, "%5F/_/c"),
        ({"tenant": "a/b", "conversationId": "c"}, "a%2Fb/_/c"),
        ({"tenant": "100%", "conversationId": "c"}, "100%25/_/c"),
        ({"tenant": "%2F", "conversationId": "c"}, "%252F/_/c"),
        ({"tenant": "__", "conversationId": "ü 📦"}, "__/_/ü 📦"),
    ],
)
def test_each_part_is_encoded(identity: Any, key: str) -> None:
    assert encode_namespace(identity) == key


def test_a_part_that_is_not_a_string_is_refused_without_quoting_it() -> None:
    with pytest.raises(TypeError) as caught:
        encode_namespace({"tenant": 987654321, "conversationId": "c"})
    assert "987654321" not in str(caught.value)
    assert "tenant" in str(caught.value)


part = st.one_of(st.none(), st.text(st.sampled_from("ab/%_"), max_size=4))
identity = st.fixed_dictionaries({"tenant": part, "principal": part, "conversationId": part})


@settings(max_examples=200, deadline=None)
@given(identity, identity)
def test_the_namespace_is_injective(
    first: dict[str, str | None], second: dict[str, str | None]
) -> None:
    # Absent, None and '' are one value; any other difference must give a different key.
    equal = all((first[k] or None) == (second[k] or None) for k in first)
    assert (encode_namespace(first) == encode_namespace(second)) == equal
