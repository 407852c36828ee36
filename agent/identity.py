"""Caller identity: validation at the door and the storage namespace (docs/checkpoint.md,
"Identity" and "Memory namespace")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.errors import InvalidRunInputError

IDENTITY_FIELDS = ("tenant", "principal", "conversationId")


def normalize_identity(value: object, field: str = "identity") -> dict[str, Any] | None:
    """A caller-passed identity as a fresh wire dict, or None when none was passed.

    tenant and principal are optional strings; conversationId is a required non-empty string.
    Keys after these three are reserved for later versions and carried as they are.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidRunInputError(field, "must be an object {tenant?, principal?, conversationId}")
    out: dict[str, Any] = {}
    for key in IDENTITY_FIELDS:
        item = value.get(key)
        if item is None:
            continue
        if not isinstance(item, str):
            # Never quote the value: identities are personal data.
            raise InvalidRunInputError(f"{field}.{key}", "must be a string")
        out[key] = item
    if not out.get("conversationId"):
        raise InvalidRunInputError(f"{field}.conversationId", "is required (a non-empty string)")
    for key, item in value.items():
        if key not in IDENTITY_FIELDS:
            out[key] = item
    return out


def _encode_part(value: object, key: str) -> str:
    if value is None or value == "":
        return "_"
    if not isinstance(value, str):
        raise TypeError(f"identity.{key} must be a string to build a storage namespace")
    if value == "_":
        return "%5F"
    return value.replace("%", "%25").replace("/", "%2F")


def encode_namespace(identity: Mapping[str, Any] | None) -> str:
    """`enc(tenant)/enc(principal)/enc(conversationId)`: injective, so tenants never collide."""
    identity = identity or {}
    return "/".join(_encode_part(identity.get(key), key) for key in IDENTITY_FIELDS)
