"""Frozen models of the signed metadata: the deployment fingerprint and the provenance record.

Performs no I/O. Every model validates itself in ``__post_init__`` and round-trips through
``to_dict``/``from_dict``; ``from_dict`` refuses unknown fields (STYLE rule 9).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dspark_calibrate.artifacts._canonical import canonical_json, sha256_hex
from dspark_calibrate.errors import InvalidValueError


def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names in declaration order (fixed once the class exists; fingerprints
    and cells are built several times per admission, so the names are looked up once)."""
    return _field_names(cls)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))

__all__ = [
    "FINGERPRINT_FLAGS",
    "NON_PRINTABLE_ASCII",
    "TRTLLM_FINGERPRINT_FIELDS",
    "Fingerprint",
    "ModelError",
    "Provenance",
    "fingerprint_flag",
    "is_printable_ascii",
    "is_sha256_hex",
]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: One character outside printable ASCII (space to tilde). Searched, never matched with ``$``,
#: which would let a trailing newline through.
NON_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")

#: The ten engine-fingerprint fields TensorRT-LLM reads, exported verbatim (DESIGN §5).
TRTLLM_FINGERPRINT_FIELDS: tuple[str, ...] = (
    "gpu",
    "gpu_count",
    "gpu_snapshot_sha256",
    "topology",
    "source_head",
    "source_diff_sha256",
    "runtime_snapshot",
    "max_draft_len",
    "rank_local_graph_batch_sizes",
    "global_graph_batch_sizes",
)


#: The command-line option that sets each fingerprint field, for ``sweep`` and ``dspark-verify``
#: alike (``--live-<name>``; docs/fingerprint.md). ``max_draft_len`` and the rank-local ladder are
#: ``sweep``'s ``--k`` and ``--ladder``; the global ladder is derived (ladder × GPU count).
FINGERPRINT_FLAGS: dict[str, str] = {
    "gpu": "--live-gpu",
    "gpu_count": "--live-gpu-count",
    "gpu_snapshot_sha256": "--live-gpu-snapshot-sha256",
    "topology": "--live-topology",
    "source_head": "--live-source-head",
    "source_diff_sha256": "--live-source-diff-sha256",
    "runtime_snapshot": "--live-runtime-snapshot",
    "max_draft_len": "--live-k",
    "rank_local_graph_batch_sizes": "--live-ladder",
    "global_graph_batch_sizes": "--live-ladder",
    "model_config_sha256": "--live-model-config",
    "checkpoint_sha256": "--live-checkpoint-sha256",
    "attention_backend": "--live-attention-backend",
    "moe_backend": "--live-moe-backend",
    "kv_dtype": "--live-kv-dtype",
    "context_len": "--context-len",
    "clock_policy": "--clock-policy",
}


def fingerprint_flag(name: str) -> str:
    """The option that sets fingerprint field ``name`` (see :data:`FINGERPRINT_FLAGS`)."""
    flag = FINGERPRINT_FLAGS[name]
    if name == "global_graph_batch_sizes":
        return f"{flag} with --live-gpu-count"
    if name in ("source_head", "source_diff_sha256"):
        return f"--live-source-dir (or {flag})"
    return flag


class ModelError(InvalidValueError):
    """A model field holds an impossible value; the message names the field."""

    default_code = "MODEL_INVALID"


def is_printable_ascii(value: object) -> bool:
    """True when ``value`` is a string of printable ASCII characters only (possibly empty)."""
    return isinstance(value, str) and NON_PRINTABLE_ASCII.search(value) is None


def is_sha256_hex(value: object) -> bool:
    """True when ``value`` is 64 lowercase hex characters."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None  # fullmatch: no trailing newline


def _check_str(name: str, value: object, *, hex64: bool = False) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise ModelError(f"fingerprint.{name} must be a non-empty string, got {value!r}")
    if not is_printable_ascii(value):
        raise ModelError(f"fingerprint.{name} must be printable ASCII, got {value!r}")
    if hex64 and not _HEX64.match(value):
        raise ModelError(f"fingerprint.{name} must be 64 lowercase hex characters, got {value!r}")


def _check_int(name: str, value: object, *, minimum: int = 1) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ModelError(f"fingerprint.{name} must be an integer >= {minimum}, got {value!r}")


def _check_ladder(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, tuple) or not value:
        raise ModelError(f"fingerprint.{name} must be a non-empty list of integers, got {value!r}")
    for g in value:
        _check_int(name, g)
    if list(value) != sorted(set(value)):
        raise ModelError(f"fingerprint.{name} must be strictly increasing, got {list(value)}")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What one deployment is: model, engine source, topology, GPU, graph ladder (DESIGN §5).

    ``None`` means "not established" (a live probe reports it as missing, never guesses). The first
    ten fields are TensorRT-LLM's engine fingerprint and are exported verbatim.
    """

    gpu: str | None = None
    gpu_count: int | None = None
    gpu_snapshot_sha256: str | None = None
    topology: str | None = None
    source_head: str | None = None
    source_diff_sha256: str | None = None
    runtime_snapshot: str | None = None
    max_draft_len: int | None = None
    rank_local_graph_batch_sizes: tuple[int, ...] | None = None
    global_graph_batch_sizes: tuple[int, ...] | None = None
    # Additions beyond TensorRT-LLM's ten (DESIGN §5).
    model_config_sha256: str | None = None
    checkpoint_sha256: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    kv_dtype: str | None = None
    context_len: int | None = None
    clock_policy: str | None = None

    _HEX_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"gpu_snapshot_sha256", "source_diff_sha256", "model_config_sha256", "checkpoint_sha256"}
    )
    _INT_FIELDS: ClassVar[frozenset[str]] = frozenset({"gpu_count", "max_draft_len", "context_len"})
    _LADDER_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"rank_local_graph_batch_sizes", "global_graph_batch_sizes"}
    )

    def __post_init__(self) -> None:
        for name in self.field_names():
            value = getattr(self, name)
            if name in self._LADDER_FIELDS:
                if isinstance(value, list):
                    object.__setattr__(self, name, tuple(value))
                _check_ladder(name, getattr(self, name))
            elif name in self._INT_FIELDS:
                _check_int(name, value)
            else:
                _check_str(name, value, hex64=name in self._HEX_FIELDS)
        rl, gl, n = self.rank_local_graph_batch_sizes, self.global_graph_batch_sizes, self.gpu_count
        if rl is not None and gl is not None and n is not None and tuple(g * n for g in rl) != gl:
            raise ModelError(
                f"fingerprint.global_graph_batch_sizes {list(gl)} must equal rank-local sizes "
                f"{list(rl)} x gpu_count {n}"
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """All field names, in declaration order."""
        return field_names(cls)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (ladders as lists, missing fields as ``None``)."""
        out: dict[str, Any] = {}
        for name in self.field_names():
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """Build from a dict, refusing unknown fields.

        Raises:
            ModelError: an unknown field or an impossible value.
        """
        if not isinstance(data, Mapping):
            raise ModelError(f"fingerprint must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.field_names()))
        if unknown:
            raise ModelError(f"fingerprint has unknown field(s) {unknown}")
        kwargs: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
        try:
            return cls(**kwargs)
        except TypeError as exc:  # wrong value types reaching comparisons
            raise ModelError(f"fingerprint: {exc}") from None

    def missing(self, names: Sequence[str] | None = None) -> tuple[str, ...]:
        """The fields (of ``names``, default all) that are not established."""
        return tuple(n for n in (names or self.field_names()) if getattr(self, n) is None)

    def trtllm_fields(self) -> dict[str, Any]:
        """The ten TensorRT-LLM fields, verbatim.

        Raises:
            ModelError: one of them is not established.
        """
        missing = self.missing(TRTLLM_FINGERPRINT_FIELDS)
        if missing:
            raise ModelError(f"fingerprint lacks TensorRT-LLM field(s) {list(missing)}")
        full = self.to_dict()
        return {k: full[k] for k in TRTLLM_FINGERPRINT_FIELDS}

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of every field (defines the artifact series)."""
        return _fingerprint_digest(self)

    def diff(self, other: Fingerprint, names: Sequence[str] | None = None) -> list[tuple[str, Any, Any]]:
        """Fields (sorted) where ``self`` and ``other`` differ, as ``(name, self, other)``."""
        out = []
        for name in sorted(names or self.field_names()):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                out.append((name, a, b))
        return out

    def replace(self, **changes: Any) -> Fingerprint:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@functools.lru_cache(maxsize=128)
def _fingerprint_digest(fp: Fingerprint) -> str:
    # Fingerprints are frozen and hashable; verification recomputes the series digest per artifact.
    return sha256_hex(canonical_json(fp.to_dict()))


@dataclass(frozen=True, slots=True)
class Provenance:
    """How an artifact was made: tool, command line, backend, clock policy, stopping rule.

    ``synthetic`` is True for anything not measured on a real deployment (the synthetic backend,
    generated traces): verification refuses it unless explicitly allowed.
    """

    tool_version: str
    command: tuple[str, ...] = ()
    backend: str | None = None
    synthetic: bool = False
    clock_policy: str | None = None
    stopping_rule: Mapping[str, Any] | None = None
    created_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.tool_version, str) or not self.tool_version:
            raise ModelError("provenance.tool_version must be a non-empty string")
        command: object = self.command  # JSON may hand us a list despite the annotation
        if isinstance(command, list):
            object.__setattr__(self, "command", tuple(command))
        if not all(isinstance(c, str) for c in self.command):
            raise ModelError("provenance.command must be a list of strings")
        if not isinstance(self.synthetic, bool):
            raise ModelError("provenance.synthetic must be a boolean")
        canonical_json(self.to_dict())  # refuses NaN and non-JSON values early

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "tool_version": self.tool_version,
            "command": list(self.command),
            "backend": self.backend,
            "synthetic": self.synthetic,
            "clock_policy": self.clock_policy,
            "stopping_rule": dict(self.stopping_rule) if self.stopping_rule is not None else None,
            "created_at": self.created_at,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """Build from a dict, refusing unknown fields."""
        if not isinstance(data, Mapping):
            raise ModelError(f"provenance must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data).difference(field_names(cls)))
        if unknown:
            raise ModelError(f"provenance has unknown field(s) {unknown}")
        kwargs = dict(data)
        if "command" in kwargs and isinstance(kwargs["command"], list):
            kwargs["command"] = tuple(kwargs["command"])
        if kwargs.get("extra") is None:
            kwargs["extra"] = {}
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ModelError(f"provenance: {exc}") from None
