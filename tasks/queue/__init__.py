"""The Celery side and each process's context: the Celery app and its JSON codec (app), the
fixes to kombu's Redis transport (broker, workarounds), the mirror of a turn's state in
Celery's result backend (results), and `job_context()`, the settings and stores one process
uses (context).

May import: tasks.core, tasks.store, tasks.budgets, agent.
"""
