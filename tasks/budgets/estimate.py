"""How many input tokens a model request holds, before it is sent.

An OpenAI model's request is counted with its own BPE encoding (o200k_base for the gpt-4o and
later families, cl100k_base for the gpt-4 and gpt-3.5 ones), plus the chat format's few tokens per
message and per request. The encoder comes from `bpe_openai` (the `tokens` extra: GitHub's
bpe-openai tokenizer with the encodings in the wheel, the same counts as tiktoken) or from
`tiktoken` when its data is at hand; tiktoken downloads its tables on first use, which a worker
without outbound access cannot do. Every other provider's request, and an OpenAI one when no
encoder loads, is estimated at one token per 3 bytes of UTF-8 text (tokenizers of current models
average about 4 bytes a token on English prose and code; 3 leaves room for other scripts) plus
the same per-message overhead. An estimate is only the input half of a reservation: the output
cap is the other (tasks/budgets/meter.py), and the settle step replaces both with what the
provider reported.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import orjson

from agent import LLMRequest

logger = logging.getLogger("agentjobs.budgets")

BYTES_PER_TOKEN = 3
# The chat format's tokens around each message and at the start of the answer (OpenAI's own
# accounting for its chat models: 3 per message, 3 for the reply's priming).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REQUEST = 3

Counter = Callable[[str], int]


def _encoding_name(model: str) -> str:
    legacy = model.startswith(("gpt-4-", "gpt-3.5")) or model in ("gpt-4", "gpt-3.5-turbo")
    return "cl100k_base" if legacy else "o200k_base"


@functools.cache
def openai_counter(model: str) -> Counter | None:
    """A token counter for an OpenAI model, or None when no encoder can be loaded."""
    name = _encoding_name(model)
    try:
        import bpe_openai  # type: ignore[import-untyped, import-not-found, unused-ignore]

        encoding: Any = bpe_openai.get_encoding(name)
        return lambda text: len(encoding.encode_ordinary(text))
    except Exception:  # not installed, or its data cannot be read
        pass
    try:
        import tiktoken  # type: ignore[import-untyped, import-not-found, unused-ignore]

        encoding = tiktoken.get_encoding(name)
        return lambda text: len(encoding.encode_ordinary(text))
    except Exception:
        logger.warning(
            "no tokenizer for %s (install agentjobs[tokens]); estimating %d bytes a token",
            model,
            BYTES_PER_TOKEN,
        )
        return None


def by_ratio(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def request_texts(request: LLMRequest) -> list[str]:
    """The pieces of a request the model reads: the system prompt, each message's content and
    tool calls, and the tool definitions."""
    texts = [request.system_prompt] if request.system_prompt else []
    for message in request.messages:
        content = message.get("content")
        texts.append(content if isinstance(content, str) else orjson.dumps(content).decode())
        calls = message.get("toolCalls")
        if calls:
            texts.append(orjson.dumps(calls).decode())
    if request.tools:
        texts.append(orjson.dumps(request.tools).decode())
    return texts


def input_tokens(provider: str, request: LLMRequest) -> int:
    """The input tokens of `request` to `provider` (LLMProvider.name), estimated."""
    count = (openai_counter(request.model) if provider == "openai" else None) or by_ratio
    texts = request_texts(request)
    overhead = TOKENS_PER_REQUEST + TOKENS_PER_MESSAGE * (len(request.messages) + 1)
    return overhead + sum(count(text) for text in texts if text)
