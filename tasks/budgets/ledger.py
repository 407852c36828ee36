"""The shared ledgers in Redis: provider budgets and tenant token caps, each step one script
(tasks/budgets/lua/), so every worker sees one ledger and no two reservations race.

A budget's limits are sliding logs, not fixed windows or token buckets: a call counts from its
reservation until a window after it was settled, at its reserved amount until then and at the
provider's reported usage after. So no span of a window's length admits more than the limit (a
fixed window admits twice the limit across its edge; GCRA does not settle a call's real use).
The cost is one sorted-set entry per call in the window, pruned as calls age out. The scripts are
ours because no library we know of reserves before a call and settles after it: `limits` and
its peers count hits at fixed costs.

    reserve   every limit of the budget admits the call's need, or none is charged; a need
              above a whole limit is refused outright; a refused call learns when its window
              frees for it and for the turns waiting ahead of it (waiters)
    settle    once per call (keyed by call id): its amounts become what it used
    close     a 429's retry-after: nothing is admitted until then
    tenant    a tenant's reported tokens in its window, against its cap
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

from tasks.core.keys import Keys, LedgerKeys
from tasks.core.limits import Budget, Limit, LimitKind, TokenCap, duration_text
from tasks.store.client import LuaScript, StateClient

# A reservation never settled (its worker died during the call) counts as spent from this long
# after it was made: longer than any model call a worker waits for (provider timeouts).
HOLD_MS = 10 * 60 * 1000
# Ledger keys expire this long after their last write, beyond their longest window.
KEEP_EXTRA_MS = 3600 * 1000


class Admission(StrEnum):
    RESERVED = "reserved"
    WAIT = "wait"
    TOO_SMALL = "too_small"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Reservation:
    admission: Admission
    limit: str = ""  # the limit that refused, as in AGENTJOBS_BUDGETS ("tokens:200000/60s")
    due_ms: int = 0  # when to try again (server epoch ms), for WAIT and CLOSED


@dataclass(frozen=True, slots=True)
class TenantUse:
    below_cap: bool
    used: int
    due_ms: int = 0  # for a tenant at its cap: when enough of its usage leaves the window


@dataclass(frozen=True)
class LimitUse:
    """One limit of a budget as counted now (Ledger.in_use)."""

    label: str  # "tokens:2400/10s"
    used: int
    amount: int
    closed_until_ms: int  # until when a provider's 429 closed the budget; 0 when open


def server_ms(client: StateClient) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _limit_part(limit: Limit) -> str:
    return f"{limit.kind}/{duration_text(limit.window_ms)}"


def _limit_keys(ledger: LedgerKeys, limit: Limit) -> list[str]:
    part = _limit_part(limit)
    return [ledger.log(part), ledger.amounts(part), ledger.total(part)]


def _keep_ms(window_ms: int) -> int:
    return window_ms + HOLD_MS + KEEP_EXTRA_MS


class Ledger:
    def __init__(self, client: StateClient, keys: Keys) -> None:
        self._redis = client
        self._keys = keys
        self._scripts: dict[str, LuaScript] = {}

    def _script(self, name: str) -> LuaScript:
        found = self._scripts.get(name)
        if found is None:
            lua = resources.files("tasks.budgets") / "lua"
            source = (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()
            found = self._scripts[name] = LuaScript(self._redis, source)
        return found

    def reserve(
        self, budget: Budget, call_id: str, waiter: str, needs: dict[LimitKind, int]
    ) -> Reservation:
        """Reserve `needs` (requests, tokens) for one call of `budget`; `waiter` is the turn."""
        ledger = self._keys.budget(budget.name)
        keys = [ledger.holds, ledger.closed, ledger.waiters]
        args: list[Any] = [call_id, waiter, HOLD_MS, _keep_ms(_longest(budget))]
        for limit in budget.limits:
            keys += _limit_keys(ledger, limit)
            args += [limit.amount, limit.window_ms, needs[limit.kind], limit.label]
        reply = self._script("reserve")(keys=keys, args=args)
        code = int(reply[0])
        if code == 1:
            return Reservation(Admission.RESERVED)
        if code == 2:
            return Reservation(Admission.WAIT, _text(reply[1]), int(reply[2]))
        if code == 3:
            return Reservation(Admission.TOO_SMALL, _text(reply[1]))
        return Reservation(Admission.CLOSED, "retry-after", int(reply[1]))

    def settle(self, budget: Budget, call_id: str, actual: dict[LimitKind, int | None]) -> bool:
        """A reserved call's use, by limit kind (None keeps the reservation); False when it was
        settled already or its hold expired."""
        ledger = self._keys.budget(budget.name)
        keys = [ledger.holds]
        args: list[Any] = [call_id, _keep_ms(_longest(budget))]
        for limit in budget.limits:
            keys += _limit_keys(ledger, limit)
            used = actual.get(limit.kind)
            args.append("" if used is None else max(0, used))
        return bool(self._script("settle")(keys=keys, args=args))

    def close(self, budget: Budget, for_ms: int) -> int:
        """Admit nothing of `budget` for `for_ms` (a 429's retry-after); -> until when."""
        ledger = self._keys.budget(budget.name)
        return int(self._script("close")(keys=[ledger.closed], args=[max(1, for_ms)]))

    def in_use(self, budget: Budget) -> list[LimitUse]:
        """What each of the budget's limits counts now: the calls held (unsettled) and those
        settled within its window, as the next reservation would count them; read only."""
        ledger = self._keys.budget(budget.name)
        now_ms = server_ms(self._redis)
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrange(ledger.holds, 0, -1)
            pipe.get(ledger.closed)
            for limit in budget.limits:
                part = _limit_part(limit)
                pipe.zrangebyscore(ledger.log(part), now_ms - limit.window_ms, "+inf")
                pipe.hgetall(ledger.amounts(part))
            held, closed, *rows = pipe.execute()
        closed_until = int(closed) if closed and int(closed) > now_ms else 0
        used = []
        for n, limit in enumerate(budget.limits):
            counted, amounts = set(held) | set(rows[2 * n]), rows[2 * n + 1]
            total = sum(int(amounts.get(call, 0)) for call in counted)
            used.append(LimitUse(limit.label, total, limit.amount, closed_until))
        return used

    def tenant_use(self, tenant: str, cap: TokenCap) -> TenantUse:
        keys = self._tenant_keys(tenant, cap)
        reply = self._script("tenant_check")(keys=keys, args=[cap.amount, cap.window_ms])
        if int(reply[0]) == 1:
            return TenantUse(True, int(reply[1]))
        return TenantUse(False, int(reply[1]), int(reply[2]))

    def tenant_add(self, tenant: str, cap: TokenCap, call_id: str, tokens: int) -> bool:
        keys = self._tenant_keys(tenant, cap)
        args: list[Any] = [call_id, max(0, tokens), _keep_ms(cap.window_ms)]
        return bool(self._script("tenant_add")(keys=keys, args=args))

    def _tenant_keys(self, tenant: str, cap: TokenCap) -> list[str]:
        ledger = self._keys.tenant_tokens(tenant)
        return _limit_keys(ledger, Limit(LimitKind.TOKENS, cap.amount, cap.window_ms))


def _longest(budget: Budget) -> int:
    return max(limit.window_ms for limit in budget.limits)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
