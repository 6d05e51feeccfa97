"""Loaders for the JSON Schemas and the logical-hash specification shipped in this package.

Imports nothing of ours; reads package data only.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["JSON_SCHEMAS", "json_schema", "logical_hash_spec"]

#: Names of the JSON Schemas shipped (``<name>.schema.json``).
JSON_SCHEMAS: tuple[str, ...] = ("fingerprint", "predicate", "bundle")


@cache
def json_schema(name: str) -> dict[str, Any]:
    """Return a shipped JSON Schema (draft 2020-12) by name: fingerprint, predicate or bundle.

    Raises:
        KeyError: unknown name.
    """
    if name not in JSON_SCHEMAS:
        raise KeyError(f"unknown JSON Schema {name!r}; known: {', '.join(JSON_SCHEMAS)}")
    text = resources.files(__package__).joinpath(f"{name}.schema.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def logical_hash_spec() -> str:
    """The logical-hash specification (Markdown)."""
    return resources.files(__package__).joinpath("logical_hash.md").read_text("utf-8")
