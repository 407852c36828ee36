"""One attempt's use of the shared ledgers, from the turn's model call check points
(tasks/turn/checkpoints.py):

    before a call   the tenant below its token cap (else wait, or a dead letter with
                    AGENTJOBS_TENANT_OVER_LIMIT=dead_letter); the call's budget reserves one
                    request and its input estimate plus output cap (else wait; a need above a
                    whole limit is a dead letter, budget_too_small)
    after a call    the reservation settled with the usage the provider reported (a failed call
                    the provider answered costs its request and no tokens; one it did not answer
                    keeps its reservation); a 429 with retry-after closes the budget until then;
                    the tenant's reported tokens counted; the attempt's usage kept for the ending

A call is keyed "<turn>:<lease token>:<call number>": each delivery has its own lease token, so a
redelivery reserves afresh, and a settle sent twice counts once. With no budget and no tenant cap
configured, a call costs no Redis command here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from agent import ModelCallReport
from tasks.budgets.estimate import input_tokens
from tasks.budgets.ledger import Admission, Ledger
from tasks.budgets.usage import AttemptUsage
from tasks.core.errors import BudgetTooSmall, BudgetWait, JobError, TenantOverLimit
from tasks.core.limits import Budget, LimitKind, duration_text
from tasks.core.settings import Settings

_T = TypeVar("_T")
Write = Callable[..., Any]

BUDGET = "budget"
TENANT_TOKENS = "tenant_tokens"


class CallMeter:
    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        *,
        turn_id: str,
        token: str,
        tenant: str | None,
        write: Write,
    ) -> None:
        self.budgets = settings.budgets
        self.output_tokens = settings.budget_output_tokens
        self.tenant = tenant
        self.cap = settings.tenant_token_limit.get(tenant) if tenant is not None else None
        self.over_limit_dead_letters = settings.tenant_over_limit == "dead_letter"
        self.ledger = ledger
        self.call_prefix = f"{turn_id}:{token}:"
        self.waiter = turn_id
        self._write = write  # a worker's patient write (ending.patiently)
        self.usage = AttemptUsage()
        # Reservations of calls in flight, by call number.
        self._reserved: dict[int, Budget] = {}

    @property
    def metered(self) -> bool:
        return bool(self.budgets) or self.cap is not None

    def before(self, report: ModelCallReport) -> JobError | None:
        """None when the call may start; a BudgetWait, or the dead letter's error."""
        if self.cap is not None and self.tenant is not None:
            use = self._write(self.ledger.tenant_use, self.tenant, self.cap)
            if not use.below_cap:
                cap = f"tokens:{self.cap.amount}/{duration_text(self.cap.window_ms)}"
                if self.over_limit_dead_letters:
                    return TenantOverLimit(self.tenant, cap, use.used)
                return BudgetWait(TENANT_TOKENS, cap, use.due_ms, budget=TENANT_TOKENS)
        budget = self.budgets.for_call(report.provider, report.model)
        if budget is None:
            return None
        needs = {LimitKind.REQUESTS: 1, LimitKind.TOKENS: 0}
        if any(limit.kind is LimitKind.TOKENS for limit in budget.limits):
            estimate = input_tokens(report.provider, report.request) if report.request else 0
            needs[LimitKind.TOKENS] = estimate + (report.output_cap or self.output_tokens)
        call_id = self.call_prefix + str(report.call_number)
        reserved = self._write(self.ledger.reserve, budget, call_id, self.waiter, needs)
        if reserved.admission is Admission.RESERVED:
            self._reserved[report.call_number] = budget
            return None
        if reserved.admission is Admission.TOO_SMALL:
            kind = LimitKind(reserved.limit.partition(":")[0])
            return BudgetTooSmall(budget.name, reserved.limit, needs[kind])
        return BudgetWait(BUDGET, reserved.limit, reserved.due_ms, budget=budget.name)

    def after(self, report: ModelCallReport) -> None:
        tokens_in, tokens_out = self.usage.add(report.model, report.usage)
        reported = report.usage is not None and (tokens_in or tokens_out)
        call_id = self.call_prefix + str(report.call_number)
        budget = self._reserved.pop(report.call_number, None)
        if budget is not None:
            tokens: int | None = None
            if reported:
                tokens = tokens_in + tokens_out
            elif report.ok is False and report.error_status is not None:
                tokens = 0  # the provider answered with an error: it generated nothing
            self._write(self.ledger.settle, budget, call_id, {LimitKind.TOKENS: tokens})
        if report.ok is False and report.error_status == 429 and report.retry_after_s:
            closing = budget or self.budgets.for_call(report.provider, report.model)
            if closing is not None:
                for_ms = math.ceil(report.retry_after_s * 1000)
                self._write(self.ledger.close, closing, for_ms)
        if self.cap is not None and self.tenant is not None and reported:
            self._write(
                self.ledger.tenant_add, self.tenant, self.cap, call_id, tokens_in + tokens_out
            )
