"""The job system's vocabulary, shared by every other room: its errors and dead-letter
reasons (errors), the one reader of the environment (settings), Redis key names (keys), the
state store's schema shared with the Lua scripts (schema), the checks on a submitted turn
(payload), identity namespaces (namespaces), state store URLs (state_url), redaction of
secrets from text (redact) and retry backoff (backoff). Pure: nothing here connects to
anything.

May import: agent (the runtime's types and errors); no other room of tasks/.
"""
