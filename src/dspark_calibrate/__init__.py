"""dspark-calibrate: measure, calibrate, sign and guard DSpark dynamic-verification evidence.

Subpackages (imports point down only, see DESIGN §3; ``tests/test_layering.py`` checks it):

- ``errors``, ``decision``: the exception hierarchy and the four-state ``Decision``; import nothing.
- ``schemas``: Arrow and JSON schemas, the logical-hash specification, the engine's cell limits.
- ``artifacts``: canonical JSON, logical hash, Parquet I/O, DSSE signing, trust root, verification.
- ``runtime_plugin``: live fingerprint, admission hook, reference selector, engine adapters.
- ``calibrate``: one sub-package per pipeline stage — ``measurement``, ``confidence``,
  ``deployment``, ``report``.
- ``cli``: the ``dspark-calibrate`` and ``dspark-verify`` commands.

Example:
    >>> import dspark_calibrate
    >>> dspark_calibrate.__version__
    '0.1.0'
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
