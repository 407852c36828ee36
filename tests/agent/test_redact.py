"""The redaction rules every layer shares (agent/redact.py)."""

from __future__ import annotations

import pytest

from agent.redact import (
    redact_tokens,
    redact_tool_error,
    redact_url_credentials,
    redact_urls,
    redact_values,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key sk-proj-Q3xT9vLm2NpR7sWk4YbZ ok", "key [redacted-key] ok"),
        ("key sk-ant-api03-H8jK2mN5pQ7rT1vX ok", "key [redacted-key] ok"),
        ("masked sk-proj-****abcd ok", "masked [redacted-key] ok"),
        ("Authorization: Bearer abc.def.ghi-jkl", "Authorization: Bearer [redacted-key]"),
        ("authorization: bearer abcdefgh12", "authorization: bearer [redacted-key]"),
        ("Basic dXNlcjpwYXNzd29yZA==", "Basic [redacted-key]"),
        # neither is a key: a word ending in "sk-", a short token
        ("task-abcdefghij and Bearer abc", "task-abcdefghij and Bearer abc"),
    ],
)
def test_tokens(text: str, expected: str) -> None:
    assert redact_tokens(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://user:pa55@host.example/v1", "https://[redacted]@host.example/v1"),
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://[redacted]@10.0.0.5:6379/0"),
        ("https://u:p@ss@host.example/x", "https://[redacted]@host.example/x"),
        (
            "https://host.example/a?api_key=abc123&page=2",
            "https://host.example/a?api_key=[redacted]&page=2",
        ),
        (
            "https://h.example/o?X-Amz-Signature=f00d#top",
            "https://h.example/o?X-Amz-Signature=[redacted]#top",
        ),
        ("https://h.example/o?access_token=t0k3n", "https://h.example/o?access_token=[redacted]"),
        # an address in a path or a query is not a login
        (
            "https://h.example/@team/page?by=a@b.example",
            "https://h.example/@team/page?by=a@b.example",
        ),
        ("https://shop.example/orders/A-17", "https://shop.example/orders/A-17"),
    ],
)
def test_url_credentials_go_and_the_rest_of_the_url_stays(text: str, expected: str) -> None:
    assert redact_url_credentials(text) == expected


def test_whole_urls() -> None:
    assert redact_urls("at https://gw.example/v1/chat, said no") == "at [redacted-url], said no"


def test_values_longest_first_and_before_the_patterns() -> None:
    # A secret that a pattern would only partly take goes whole: values run first.
    secret = "sk-live-ABCDEFGH!!tail"
    assert redact_tool_error(f"bad {secret}", [secret, "sk-live"]) == "bad [redacted-secret]"
    assert redact_values("HOST.example", ["host.example"], "[x]", ignore_case=True) == "[x]"
    assert redact_values("nothing here", []) == "nothing here"


def test_tool_error_redaction_is_idempotent() -> None:
    text = "sk-proj-Q3xT9vLm2NpR7sWk4YbZ at https://u:p@h.x/?token=abc and Bearer abcdefgh1"
    once = redact_tool_error(text)
    assert (
        once
        == "[redacted-key] at https://[redacted]@h.x/?token=[redacted] and Bearer [redacted-key]"
    )
    assert redact_tool_error(once) == once
