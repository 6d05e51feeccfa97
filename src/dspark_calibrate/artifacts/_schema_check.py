"""Validate the JSON files this tool writes against the shipped JSON Schemas, offline.

Every schema is registered locally (a ``referencing`` registry that refuses to retrieve
anything), so the ``https://dspark-calibrate.dev/schemas/...`` ids the schemas refer to each
other by are names, never addresses: validation never touches the network. A document is
recognised by its content (a DSSE envelope, a TUF root, a ``schema`` or ``format`` tag, the keys
only one file has), then by its file name; a DSSE envelope is validated together with its
decoded payload (the in-toto statement and its predicate).

Performs no file I/O: callers pass bytes or parsed documents (parsed with the package's strict
reader, :func:`loads_strict`). ``jsonschema`` is imported on first use, not when the package is.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from dspark_calibrate.artifacts._canonical import loads_strict
from dspark_calibrate.artifacts._models import TRTLLM_FINGERPRINT_FIELDS
from dspark_calibrate.errors import InvalidValueError
from dspark_calibrate.schemas import JSON_SCHEMAS, json_schema

__all__ = [
    "DOCUMENT_SCHEMAS",
    "SchemaProblem",
    "SchemaReport",
    "recognise",
    "schema_registry",
    "validate_bytes",
    "validate_document",
]

#: Schemas that hold only definitions other schemas refer to; no document is validated by them.
_DEFINITION_SCHEMAS = frozenset({"common", "mixed-summaries"})
#: The schemas a whole file can be validated against (``--schema`` accepts these).
DOCUMENT_SCHEMAS: tuple[str, ...] = tuple(n for n in JSON_SCHEMAS if n not in _DEFINITION_SCHEMAS)
#: Characters of an instance quoted in a problem message at most (a oneOf failure quotes it whole).
_MESSAGE_CHARS = 240

#: A file holding exactly TensorRT-LLM's ten engine-fingerprint fields is the exported live
#: fingerprint; one holding more is a deployment fingerprint file.
_ENGINE_FIELDS = frozenset(TRTLLM_FINGERPRINT_FIELDS)
#: ``schema`` tags of the TensorRT-LLM mixed files (TRTLLM_MIXED.md).
_SCHEMA_TAGS: Mapping[str, str] = {
    "dspark-mixed-live-fingerprint-v1": "trtllm-mixed-live-fingerprint",
    "dspark-mixed-breakable-costs-v1": "trtllm-mixed-costs",
    "dspark-mixed-breakable-admission-v1": "trtllm-mixed-admission",
}
#: ``format`` tags of the mixed evidence's result files.
_FORMAT_TAGS: Mapping[str, str] = {
    "dspark-calibrate/mixed-accuracy/v1": "mixed-result-accuracy",
    "dspark-calibrate/mixed-runtime-invariants/v1": "mixed-result-runtime-invariants",
    "dspark-calibrate/mixed-matched-workload/v1": "mixed-result-matched-workload",
    "dspark-calibrate/mixed-source-and-measurements/v1": "mixed-result-source-and-measurements",
}
#: Documents told apart by keys only they hold, tried in order: (schema, keys it must hold).
_KEY_SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("dsse-envelope", frozenset({"payload", "payloadType", "signatures"})),
    ("rollback-state", frozenset({"schema_version", "series", "trust_root"})),
    ("admission-receipt", frozenset({"schema_version", "admission", "admission_sha256"})),
    ("trtllm-sps-table", frozenset({"schema_version", "cost_tables", "measurements"})),
    ("sts", frozenset({"sts_temperatures"})),
    ("fit-report", frozenset({"calibration", "options", "summary", "before", "after"})),
    ("build", frozenset({"out_dir", "bundle", "fingerprint_digest", "replay", "selection"})),
    ("admission-decision", frozenset({"active", "reason_code", "message", "mixed"})),
)
#: The last resort: file names the tool gives its JSON files.
_FILE_NAMES: Mapping[str, str] = {
    "measurement_results.json": "mixed-result-measurement-results",
    "root.json": "trust-root",
    "trust-root.json": "trust-root",
    "fingerprint.json": "fingerprint",
}


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One way a document breaks its schema.

    Attributes:
        where: the place in the document, as a JSONPath (``$.predicate.summary.admitted``).
        message: what is wrong there.
    """

    where: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"where": self.where, "message": self.message}


@dataclass(frozen=True, slots=True)
class SchemaReport:
    """The outcome of validating one document.

    Attributes:
        schema: the schema it was validated against (``None``: no shipped schema recognises it).
        problems: every violation, in document order (empty: valid).
        payload: for a DSSE envelope, the report on its decoded payload (the statement).
    """

    schema: str | None
    problems: tuple[SchemaProblem, ...] = ()
    payload: SchemaReport | None = None

    @property
    def known(self) -> bool:
        """A shipped schema recognised the document."""
        return self.schema is not None

    @property
    def ok(self) -> bool:
        """Recognised, valid, and (for an envelope) its payload valid too."""
        return self.known and not self.problems and (self.payload is None or self.payload.ok)

    def all_problems(self) -> tuple[SchemaProblem, ...]:
        """The document's problems, then its payload's (their places prefixed ``payload``)."""
        inner = () if self.payload is None else self.payload.all_problems()
        return self.problems + tuple(SchemaProblem(f"payload{p.where[1:]}", p.message) for p in inner)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "schema": self.schema,
            "valid": self.ok,
            "problems": [p.to_dict() for p in self.problems],
            "payload": None if self.payload is None else self.payload.to_dict(),
        }


def _refuse_retrieval(uri: str) -> Any:
    # Every schema is registered up front; anything else is a name no schema ships, never a URL
    # to fetch.
    raise LookupError(f"{uri} is not a shipped schema; validation never retrieves schemas")


@cache
def schema_registry() -> Any:
    """A ``referencing.Registry`` holding every shipped schema under its ``$id`` (offline)."""
    from referencing import Registry, Resource

    resources = [(json_schema(n)["$id"], Resource.from_contents(json_schema(n))) for n in JSON_SCHEMAS]
    # ``retrieve`` is the attrs alias of the registry's private ``_retrieve`` field, unseen by mypy.
    registry = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
    return registry.with_resources(resources).crawl()


@cache
def _validator(name: str) -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json_schema(name), registry=schema_registry())


def recognise(document: Any, filename: str | None = None) -> str | None:
    """The schema a document the tool wrote is validated against, or ``None``.

    Content first (a DSSE envelope, a TUF root, a ``schema`` or ``format`` tag, keys only one
    file has), then the file name.
    """
    if isinstance(document, Mapping):
        found = _recognise_object(document)
        if found is not None:
            return found
    return _FILE_NAMES.get(filename or "")


def _recognise_object(document: Mapping[str, Any]) -> str | None:
    signed = document.get("signed")
    if isinstance(signed, Mapping) and signed.get("_type") == "root" and "signatures" in document:
        return "trust-root"
    tag = document.get("schema")
    if isinstance(tag, str) and tag in _SCHEMA_TAGS:
        return _SCHEMA_TAGS[tag]
    fmt = document.get("format")
    if isinstance(fmt, str) and fmt in _FORMAT_TAGS:
        return _FORMAT_TAGS[fmt]
    keys = frozenset(document)
    for name, needed in _KEY_SIGNATURES:
        if needed <= keys:
            return name
    if keys == _ENGINE_FIELDS:
        return "trtllm-live-fingerprint"
    if keys >= _ENGINE_FIELDS:
        return "fingerprint"
    return None


def _where(path: Any) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _problems(name: str, document: Any) -> tuple[SchemaProblem, ...]:
    from jsonschema.exceptions import best_match

    out = []
    for error in sorted(_validator(name).iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        # A oneOf/anyOf failure quotes the whole instance; its closest branch says what is wrong.
        shown = best_match(error.context) if error.context else error
        message = shown.message if len(shown.message) <= _MESSAGE_CHARS else shown.message[:_MESSAGE_CHARS] + "..."
        out.append(SchemaProblem(_where(shown.absolute_path), message))
    return tuple(out)


def validate_document(document: Any, *, schema: str | None = None, filename: str | None = None) -> SchemaReport:
    """Validate a parsed document against ``schema`` (default: the one :func:`recognise` names).

    Args:
        document: the parsed JSON.
        schema: the schema to use (one of :data:`DOCUMENT_SCHEMAS`); default: recognised.
        filename: the file's name, a hint when the content does not say what it is.

    Returns:
        The report; ``schema`` is None when nothing recognises the document.

    Raises:
        InvalidValueError: ``schema`` names no shipped document schema.
    """
    if schema is not None and schema not in DOCUMENT_SCHEMAS:
        raise InvalidValueError(f"unknown schema {schema!r}; known: {', '.join(DOCUMENT_SCHEMAS)}")
    name = schema or recognise(document, filename)
    if name is None:
        return SchemaReport(None)
    problems = _problems(name, document)
    payload = _payload_report(document) if name == "dsse-envelope" and not problems else None
    return SchemaReport(name, problems, payload)


def _payload_report(envelope: Mapping[str, Any]) -> SchemaReport:
    """The envelope's payload (base64 of the statement's JSON), validated as a statement."""
    try:
        raw = base64.b64decode(envelope["payload"], validate=True)
        statement = loads_strict(raw, what="payload")
    except (binascii.Error, InvalidValueError) as exc:
        return SchemaReport("statement", (SchemaProblem("$", f"not base64 of a JSON statement ({exc})"),))
    return SchemaReport("statement", _problems("statement", statement))


def validate_bytes(
    data: bytes, *, where: str, schema: str | None = None, filename: str | None = None
) -> SchemaReport:
    """Parse (strictly: no duplicate keys, NaN or Infinity) and validate a file's bytes (see
    :func:`validate_document`).

    Raises:
        InvalidValueError: the bytes are not acceptable JSON (a ``JsonError``), or ``schema`` is
            unknown.
    """
    return validate_document(loads_strict(data, what=where), schema=schema, filename=filename)
