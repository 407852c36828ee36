"""The chaos soak's agent (bench/soak.py): a gateway that fails the way a busy one does, and a
tool with a counted side effect.

A turn's message names everything about it: `soak turn 17 conversation c17 rounds=2`, plus
` fail=401` for a turn whose credentials are refused once its first tool round ran (these are
chosen at submission, so the expected dead letters are known). Every other fault is decided per
model call from (seed, turn, call number) by a hash, so a run is reproducible: for call k of
turn n, u = hash(seed, n, k) in [0, 1) gives HTTP 503 below RATE_503, HTTP 429 with a
retry-after of RETRY_AFTER_S below RATE_503 + RATE_429, else an answer; each call first sleeps
hash(seed, n, k, latency) * LATENCY_MAX_S. Each turn runs 1-2 rounds of a tool that counts its
execution in Redis (the side effect), then waits up to TOOL_LATENCY_MAX_S: record_effect
(effect `idempotent`), or for every third turn record_unsafe_effect (effect `unsafe`). Each
start is also logged with the idempotency key and attempt it saw, and whether it returned.
Call numbers, side effects and starts are kept in Redis, so they survive kills and resumes.

The mixed soak (bench/soak.py --mixed) adds ` approve=1` for a turn whose first round calls
record_approved_effect, which needs a person's approval (the soak's decider approves, rejects
or leaves it to expire), ` slow=1` for a turn whose first round calls record_slow_effect,
which outlasts its tool timeout (SLOW_TIMEOUT_S: the model reads `[timed out] ...`), ` hang=1`
for a turn whose first tool call hangs
for HANG_S (the turn has a deadline shorter than that), reads the retry-after of a 429 from
SOAK_RETRY_AFTER_S, and has every answered call reported with USAGE tokens and logged, with
its time, under calls_log_key: the provider's own record of what the shared budget admitted.

The error texts quote the API key and the endpoint URL, as a careless gateway's do: the job
system must redact them before storing or logging anything.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import redis

from agent import (
    Agent,
    LLMRequest,
    LLMResponse,
    ProviderHTTPError,
    ToolCall,
    ToolContext,
    tool,
)
from tasks.queue.context import job_context

RATE_503 = 0.15
RATE_429 = 0.05
RETRY_AFTER_S = 1.0
LATENCY_MAX_S = 0.3
# After its side effect, the tool waits this long at most for the downstream's reply: a kill
# can land between the effect and the persisted round, which is what may repeat it.
TOOL_LATENCY_MAX_S = 0.2
# How long the provider and the tool wait for their Redis counters across a Redis restart:
# the soak injects gateway faults only, never faults of its own bookkeeping.
REDIS_PATIENCE_S = 60.0
SEED_VARIABLE = "SOAK_SEED"
RETRY_AFTER_VARIABLE = "SOAK_RETRY_AFTER_S"
HANG_S = 12.0
# What each answered call reports as its usage (the budget settles with it).
USAGE = {"inputTokens": 40, "outputTokens": 10}
TOOL_NAME = "record_effect"
UNSAFE_TOOL_NAME = "record_unsafe_effect"
APPROVED_TOOL_NAME = "record_approved_effect"
SLOW_TOOL_NAME = "record_slow_effect"
SLOW_TIMEOUT_S = 1.0
SLOW_S = 2.5
# What the soak's decider (bench/soak_decider.py) writes when it rejects a call.
REJECTION = "not this one (the soak's decider)"

_TURN = re.compile(r"\bsoak turn (\d+)\b")
_ROUNDS = re.compile(r"\brounds=(\d+)\b")
_REFUSED = " fail=401"
_HANG = " hang=1"
_APPROVE = " approve=1"
_SLOW = " slow=1"

T = TypeVar("T")


def soak_message(
    turn: int,
    conversation: str,
    rounds: int,
    refused: bool,
    hang: bool = False,
    approve: bool = False,
    slow: bool = False,
) -> str:
    return (
        f"soak turn {turn} conversation {conversation} rounds={rounds}"
        + (_HANG if hang else "")
        + (_APPROVE if approve else "")
        + (_SLOW if slow else "")
        + (_REFUSED if refused else "")
    )


def is_unsafe_turn(turn: int) -> bool:
    """Every third turn's tool is declared unsafe: an interrupted call must not run again."""
    return turn % 3 == 0


def tool_name_for(turn: int, round_: int = 1, approve: bool = False, slow: bool = False) -> str:
    if approve and round_ == 1:
        return APPROVED_TOOL_NAME
    if slow and round_ == 1:
        return SLOW_TOOL_NAME
    return UNSAFE_TOOL_NAME if is_unsafe_turn(turn) else TOOL_NAME


def answer_for(turn: int) -> str:
    return f"turn {turn} done"


def tool_call_id(turn: int, round_: int) -> str:
    return f"t{turn}r{round_}"


def effect_result(turn: int, round_: int) -> dict[str, Any]:
    """What record_effect returns (the tool message's content, as JSON)."""
    return {"turn": turn, "round": round_, "recorded": True}


def calls_key(prefix: str, turn: int) -> str:
    """String counter: model calls made for a turn (every attempt and delivery)."""
    return f"{prefix}:soak:calls:{turn}"


def effects_key(prefix: str) -> str:
    """Hash "turn:round" -> executions of record_effect: the counted side effect."""
    return f"{prefix}:soak:effects"


def starts_key(prefix: str) -> str:
    """List of JSON {turn, round, key, attempt} per start of a tool call, and {turn, round,
    attempt, returned: true} when that start returned."""
    return f"{prefix}:soak:starts"


def calls_log_key(prefix: str) -> str:
    """List of JSON [epoch ms, tokens] per model call the gateway answered or refused (a
    refused call counts as a request of 0 tokens): what a shared budget let through."""
    return f"{prefix}:soak:calls-log"


def decision_for(seed: int, turn: int) -> str:
    """What the soak's decider does with turn `turn`'s approval: approve half, reject three
    in ten, leave the rest to expire."""
    u = unit_hash(seed, turn, "decision")
    return "approve" if u < 0.5 else "reject" if u < 0.8 else "expire"


def decisions_key(prefix: str) -> str:
    """Hash turn -> the decision the decider recorded (approve, reject), once it did."""
    return f"{prefix}:soak:decisions"


def faults_key(prefix: str) -> str:
    """Hash HTTP status -> faults injected."""
    return f"{prefix}:soak:faults"


def unit_hash(seed: int, *parts: object) -> float:
    """A number in [0, 1) fixed by seed and parts."""
    text = ":".join(str(p) for p in (seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def fault_for(seed: int, turn: int, call: int) -> int | None:
    """The HTTP status injected on call `call` of turn `turn`, or None."""
    u = unit_hash(seed, turn, call)
    if u < RATE_503:
        return 503
    if u < RATE_503 + RATE_429:
        return 429
    return None


def patiently(command: Callable[[], T]) -> T:
    """Run a Redis command, waiting out a Redis restart."""
    deadline = time.monotonic() + REDIS_PATIENCE_S
    while True:
        try:
            return command()
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _last_user(request: LLMRequest) -> tuple[int, str]:
    for index in range(len(request.messages) - 1, -1, -1):
        if request.messages[index].get("role") == "user":
            return index, str(request.messages[index].get("content", ""))
    return -1, ""


def _number(pattern: re.Pattern[str], text: str) -> int:
    found = pattern.search(text)
    if found is None:
        raise ValueError(f"not a soak message: {text[:80]!r}")
    return int(found.group(1))


class FaultyGatewayProvider:
    name = "soak-gateway"

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def complete(self, request: LLMRequest) -> LLMResponse:
        index, text = _last_user(request)
        turn = _number(_TURN, text)
        context = job_context()
        call = int(patiently(lambda: context.redis.incr(calls_key(context.keys.prefix, turn))))
        time.sleep(unit_hash(self.seed, turn, call, "latency") * LATENCY_MAX_S)
        rounds_done = sum(1 for m in request.messages[index + 1 :] if m.get("role") == "tool")
        status = 401 if text.endswith(_REFUSED) and rounds_done >= 1 else None
        status = status or fault_for(self.seed, turn, call)
        tokens = 0 if status is not None else USAGE["inputTokens"] + USAGE["outputTokens"]
        entry = orjson.dumps([int(time.time() * 1000), tokens])
        patiently(lambda: context.redis.rpush(calls_log_key(context.keys.prefix), entry))
        if status is not None:
            self._refuse(status)
        if rounds_done < _number(_ROUNDS, text):
            round_ = rounds_done + 1
            args: dict[str, Any] = {"turn": turn, "round": round_}
            if _HANG in text:
                args["hang"] = True
            name = tool_name_for(turn, round_, _APPROVE in text, _SLOW in text)
            asked = ToolCall(tool_call_id(turn, round_), name, args)
            return LLMResponse(tool_calls=[asked], usage=USAGE)
        return LLMResponse(content=answer_for(turn), usage=USAGE)

    def _refuse(self, status: int) -> None:
        context = job_context()
        patiently(lambda: context.redis.hincrby(faults_key(context.keys.prefix), str(status), 1))
        key = os.environ.get("OPENAI_API_KEY", "")
        url = os.environ.get("OPENAI_BASE_URL", "")
        raise ProviderHTTPError(
            f"gateway {url}/chat/completions answered HTTP {status} for api key {key}",
            status=status,
            retry_after_s=float(os.environ.get(RETRY_AFTER_VARIABLE) or RETRY_AFTER_S)
            if status == 429
            else None,
        )


def _record(
    turn: int, round_: int, ctx: ToolContext, hang: bool = False, slow: bool = False
) -> dict[str, Any]:
    context = job_context()
    prefix = context.keys.prefix
    start = {"turn": turn, "round": round_, "key": ctx.idempotency_key, "attempt": ctx.attempt}
    patiently(lambda: context.redis.rpush(starts_key(prefix), orjson.dumps(start)))
    field = f"{turn}:{round_}"
    done = patiently(lambda: context.redis.hincrby(effects_key(prefix), field, 1))
    seed = int(os.environ.get(SEED_VARIABLE, "0"))
    pause = unit_hash(seed, turn, round_, done, "tool") * TOOL_LATENCY_MAX_S
    time.sleep(HANG_S if hang else SLOW_S if slow else pause)
    returned = {"turn": turn, "round": round_, "attempt": ctx.attempt, "returned": True}
    patiently(lambda: context.redis.rpush(starts_key(prefix), orjson.dumps(returned)))
    return effect_result(turn, round_)


@tool(name=TOOL_NAME, description="Record that round `round` of turn `turn` ran (counted).")
def record_effect(turn: int, round: int, ctx: ToolContext, hang: bool = False) -> dict[str, Any]:
    return _record(turn, round, ctx, hang)


@tool(
    name=UNSAFE_TOOL_NAME,
    description="Record that round `round` of turn `turn` ran; must never run twice.",
    effect="unsafe",
)
def record_unsafe_effect(
    turn: int, round: int, ctx: ToolContext, hang: bool = False
) -> dict[str, Any]:
    return _record(turn, round, ctx, hang)


@tool(
    name=APPROVED_TOOL_NAME,
    description="Record that round `round` of turn `turn` ran, once a person approved it.",
    approval=True,
)
def record_approved_effect(
    turn: int, round: int, ctx: ToolContext, hang: bool = False
) -> dict[str, Any]:
    return _record(turn, round, ctx, hang)


@tool(
    name=SLOW_TOOL_NAME,
    description="Record that round `round` of turn `turn` ran, then take longer than allowed.",
    timeout_s=SLOW_TIMEOUT_S,
)
def record_slow_effect(turn: int, round: int, ctx: ToolContext) -> dict[str, Any]:
    return _record(turn, round, ctx, slow=True)


def build_soak_agent() -> Agent:
    return Agent(
        provider=FaultyGatewayProvider(int(os.environ.get(SEED_VARIABLE, "0"))),
        model="soak-model",
        system="You are the soak's agent.",
        tools=[record_effect, record_unsafe_effect, record_approved_effect, record_slow_effect],
        id="soak",
        max_iterations=8,
    )
