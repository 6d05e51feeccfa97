"""Small JSON inputs read from a path: an expected or live deployment fingerprint.

One reader for every command and stage that takes a fingerprint file (``sweep --fingerprint``,
``fit --fingerprint``, ``dspark-verify --expect-fingerprint``, ``export``, ``report``). The file is
read bounded and non-blocking (:func:`~dspark_calibrate.artifacts._files.read_regular_file`) and
parsed strictly (duplicate keys, non-finite numbers and unknown fields are refused).
"""

from __future__ import annotations

from pathlib import Path

from dspark_calibrate.artifacts._canonical import JsonError, loads_strict
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file
from dspark_calibrate.artifacts._models import Fingerprint, ModelError
from dspark_calibrate.errors import ConfigError

__all__ = ["MAX_FINGERPRINT_FILE_BYTES", "read_fingerprint"]

#: Largest fingerprint file read, in bytes. A fingerprint (with a model-config digest and a source
#: tree hash) is well under 4 KiB; TensorRT-LLM's live_fingerprint.json wraps one in a few fields.
MAX_FINGERPRINT_FILE_BYTES = 1 << 16


def read_fingerprint(path: Path | str) -> Fingerprint:
    """Read a fingerprint file: the fields of :class:`Fingerprint` as a JSON object, or a document
    holding that object under ``"fingerprint"`` (TensorRT-LLM's ``live_fingerprint.json``).

    Raises:
        ConfigError: unreadable, not a regular file, too large, not strict JSON, or not a
            fingerprint; the message names the file and the fix.
    """
    p = Path(path)
    try:
        data = read_regular_file(p, MAX_FINGERPRINT_FILE_BYTES)
    except FileTooLarge:
        raise ConfigError(
            f"{p}: larger than {MAX_FINGERPRINT_FILE_BYTES} bytes; not a fingerprint file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read fingerprint ({exc.strerror or exc})") from exc
    try:
        doc = loads_strict(data, what=str(p))
        if isinstance(doc, dict) and isinstance(doc.get("fingerprint"), dict):
            doc = doc["fingerprint"]
        return Fingerprint.from_dict(doc)
    except (JsonError, ModelError) as exc:
        raise ConfigError(
            f"{p}: invalid fingerprint: {exc}; pass a JSON object with Fingerprint's fields "
            "(docs/fit.md) or TensorRT-LLM's live_fingerprint.json"
        ) from exc
