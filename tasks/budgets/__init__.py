"""Shared provider budgets and tenant token caps (docs/platform.md, "Budgets and fairness").

estimate.py  a model call's input tokens: a real tokenizer for OpenAI models, a ratio else
ledger.py    the shared ledgers in Redis: reserve, settle, close (a 429), tenant caps
meter.py     one attempt's use of them, from the turn's check points
usage.py     tokens in and out per tenant, agent and model, for `agentjobs usage`

Below tasks.queue (whose JobContext holds the ledger) and above tasks.store.

May import: tasks.core, tasks.store, agent.
"""
