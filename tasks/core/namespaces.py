"""Identity namespaces: `tenant/principal/conversationId` as the runtime encodes them
(docs/checkpoint.md, "Memory namespace"), and which identity may see which namespace."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent import encode_namespace
from tasks.core.errors import BadPayload


def namespace_for(conversation_id: str, identity: Mapping[str, Any] | None) -> str:
    return encode_namespace({**(identity or {}), "conversationId": conversation_id})


_ESCAPE = re.compile(r"%(25|2F)")


def _decode_part(part: str) -> str | None:
    if part == "_":
        return None
    if part == "%5F":
        return "_"
    return _ESCAPE.sub(lambda m: "%" if m.group(1) == "25" else "/", part)


def owner_of_namespace(namespace: str) -> tuple[str | None, str | None]:
    """(tenant, principal) of a namespace as encode_namespace wrote it (None for none)."""
    parts = namespace.split("/")
    if len(parts) != 3:
        return None, None
    return _decode_part(parts[0]), _decode_part(parts[1])


def in_namespace_of(namespace: str, identity: Mapping[str, Any]) -> bool:
    """Whether a turn of `namespace` is one `identity` ({tenant?, principal?,
    conversationId?}, as run_turn takes it) may see: the same tenant and principal, and the
    same conversation when it names one. Raises BadPayload for an identity that is not one."""
    if not isinstance(identity, Mapping):
        raise BadPayload("identity", "must be an object {tenant?, principal?}")
    for key in ("tenant", "principal", "conversationId"):
        if identity.get(key) is not None and not isinstance(identity[key], str):
            raise BadPayload(f"identity.{key}", "must be a string")
    conversation = identity.get("conversationId")
    if conversation:
        return namespace == namespace_for(conversation, identity)
    prefix = namespace_for("", identity).removesuffix("_")
    return namespace.startswith(prefix) and "/" not in namespace[len(prefix) :]
