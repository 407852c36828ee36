"""Identity namespaces: `tenant/principal/conversationId` as the runtime encodes them
(docs/checkpoint.md, "Memory namespace"), which identity may see which namespace, and the
identities a lookup that found nothing may have meant (IdentityHint; docs/jobs.md,
"Identity and lookups by conversation id")."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent import encode_namespace
from tasks.core.errors import BadPayload


def namespace_for(conversation_id: str, identity: Mapping[str, Any] | None) -> str:
    return encode_namespace({**(identity or {}), "conversationId": conversation_id})


class IdentityHint(UserWarning):
    """A lookup by conversation id (load_conversation, cancel_conversation) found nothing in
    the namespace of the identity it was given, or of none, while the caller may have meant
    another identity: the conversation's turns are filed under the identity run_turn was
    given. The message names the conversation id and which identity fields were set, never
    their values (identities are personal data). Silence it with
    `warnings.filterwarnings("ignore", category=IdentityHint)`."""


OWNER_FIELDS = ("tenant", "principal")


def owner_fields(identity: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Which of tenant and principal `identity` sets (a namespace part other than `_`)."""
    return tuple(key for key in OWNER_FIELDS if identity and identity.get(key) not in (None, ""))


def broader_identities(identity: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The identities with some of `identity`'s tenant and principal left out, the default
    identity (neither) last: {tenant, principal} gives {tenant}, {principal}, {}; one field
    gives {}; none gives nothing. Where a caller who passed `identity` may find the turns of
    someone who passed less."""
    if identity is None:
        return []
    fields = owner_fields(identity)
    if len(fields) == 2:
        return [{"tenant": identity["tenant"]}, {"principal": identity["principal"]}, {}]
    return [{}] if fields else []


def describe_identity(identity: Mapping[str, Any] | None) -> str:
    """Which owner fields an identity sets, without their values: "tenant and principal",
    "tenant only", "principal only", "no tenant and no principal"."""
    fields = owner_fields(identity)
    if not fields:
        return "no tenant and no principal"
    return " and ".join(fields) if len(fields) == 2 else f"{fields[0]} only"


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
